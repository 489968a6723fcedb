package apiserver

import (
	"encoding/base64"
	"net/http"
	"strings"

	"github.com/obmesh/obmesh/coordinator/api"
)

// maxProtocolToken bounds the encoded token taken from a subprotocol.
const maxProtocolToken = 1024

// bearerToken returns the request's bearer token: from the Authorization
// header ("Bearer <token>"), or, for a WebSocket handshake without an
// Authorization header only, from a Sec-WebSocket-Protocol entry
// api.TokenSubprotocolPrefix + base64url(token) (see coordinator/api's
// wsauth.go): browsers cannot set headers on a WebSocket.
func bearerToken(r *http.Request) (string, bool) {
	if h := r.Header.Get("Authorization"); h != "" {
		return strings.CutPrefix(h, "Bearer ")
	}
	if r.Method != http.MethodGet || !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		return "", false
	}
	for _, v := range r.Header.Values("Sec-WebSocket-Protocol") {
		for p := range strings.SplitSeq(v, ",") {
			enc, ok := strings.CutPrefix(strings.TrimSpace(p), api.TokenSubprotocolPrefix)
			if !ok || len(enc) > maxProtocolToken {
				continue
			}
			tok, err := base64.RawURLEncoding.DecodeString(enc)
			if err != nil {
				return "", false
			}
			return string(tok), true
		}
	}
	return "", false
}

// consoleProtocols are the subprotocols a console WebSocket accepts: the
// handshake answers with api.ConsoleSubprotocol when the client offered
// it (a browser fails a handshake that offered subprotocols and got none
// back) and never with the token entry.
var consoleProtocols = []string{api.ConsoleSubprotocol}
