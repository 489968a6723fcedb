package apiserver

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/coder/websocket"
)

func TestConsoleEnd_ErrorsAreNotNormalClosures(t *testing.T) {
	if c, _ := consoleEnd(io.EOF); c != websocket.StatusNormalClosure {
		t.Errorf("EOF: %v", c)
	}
	if c, _ := consoleEnd(nil); c != websocket.StatusNormalClosure {
		t.Errorf("nil: %v", c)
	}
	long := errors.New("console ended: driver plugin acme exited (signal: killed) while the console was open; " + strings.Repeat("é", 100))
	c, reason := consoleEnd(fmt.Errorf("x: %w", long))
	if c != websocket.StatusInternalError || len(reason) > 123 || !utf8.ValidString(reason) || !strings.HasPrefix(reason, "x: console ended: driver plugin acme exited") {
		t.Errorf("plugin death: %v %q (%d bytes)", c, reason, len(reason))
	}
}
