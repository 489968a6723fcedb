package api

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// A refused console handshake reports the API's error code and message,
// also when the body (a long receipt after the error) is longer than the
// part the WebSocket dialer keeps.
func TestConsole_RefusedHandshakeKeepsTheErrorCode(t *testing.T) {
	for _, receiptBytes := range []int{0, 10 << 10} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/v1/status" {
				json.NewEncoder(w).Encode(Status{ID: "c1", IsLeader: true})
				return
			}
			var body ErrorBody
			body.Error.Code, body.Error.Message = CodeBMCAuth, "authentication failed at 10.0.0.5: wrong user name or password"
			if receiptBytes > 0 {
				body.Receipt = &Receipt{ID: "op-1", Error: strings.Repeat("x", receiptBytes)}
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadGateway)
			enc := json.NewEncoder(w)
			enc.SetIndent("", "  ")
			enc.Encode(body)
		}))
		c := NewClient(srv.URL, "t", srv.Client())
		_, err := c.Console(t.Context(), "n1")
		srv.Close()
		var ae *Error
		if !errors.As(err, &ae) || ae.Code != CodeBMCAuth || !strings.Contains(ae.Message, "wrong user name or password") || ae.StatusCode != 502 {
			t.Errorf("receipt of %d bytes: err = %#v, want bmc_auth_failed with the message", receiptBytes, err)
		}
	}
}
