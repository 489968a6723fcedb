package apiserver

import (
	"errors"
	"io"
	"unicode/utf8"

	"github.com/coder/websocket"
)

// consoleEnd is how a console WebSocket closes after the console's last
// read: normally when the console ended (EOF), with StatusInternalError
// and the error (cut to what a close frame holds) when it failed, e.g. its
// driver plugin died, so a client can tell the two apart.
func consoleEnd(err error) (websocket.StatusCode, string) {
	if err == nil || errors.Is(err, io.EOF) {
		return websocket.StatusNormalClosure, "console ended"
	}
	reason := err.Error()
	const max = 123 // a close frame's reason
	if len(reason) > max {
		cut := max - len("…")
		for cut > 0 && !utf8.RuneStart(reason[cut]) {
			cut--
		}
		reason = reason[:cut] + "…"
	}
	return websocket.StatusInternalError, reason
}
