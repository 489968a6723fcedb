package sdk

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestErrors_SurviveTheWire(t *testing.T) {
	for _, sentinel := range []error{ErrUnsupported, ErrAuth, ErrUnreachable, ErrBusy, ErrInvalid, ErrTimeout, ErrProtocol, ErrPrivilege, ErrQuota, ErrConflict} {
		wrapped := fmt.Errorf("acme: power on: %w", sentinel)
		back := fromStatus(context.Background(), toStatus(wrapped))
		if !errors.Is(back, sentinel) {
			t.Errorf("%v: after the wire errors.Is = false (got %v)", sentinel, back)
		}
		if back.Error() != wrapped.Error() {
			t.Errorf("message changed: %q -> %q", wrapped, back)
		}
	}
	// Unclassified driver errors are internal, deadline errors timeouts.
	if c := ClassOf(fromStatus(context.Background(), toStatus(errors.New("boom")))); c != ClassInternal {
		t.Errorf("plain error class = %q, want internal", c)
	}
	if c := ClassOf(fromStatus(context.Background(), toStatus(context.DeadlineExceeded))); c != ClassTimeout {
		t.Errorf("deadline class = %q, want timeout", c)
	}
}

func TestErrors_TransportFailureIsNotUnreachable(t *testing.T) {
	// A broken plugin connection is codes.Unavailable too; without the
	// driver's ErrorInfo it must be a plugin failure, not a BMC problem.
	err := fromStatus(context.Background(), status.Error(codes.Unavailable, "connection refused"))
	if errors.Is(err, ErrUnreachable) || !errors.Is(err, ErrPlugin) {
		t.Errorf("transport failure = %v (class %q), want plugin", err, ClassOf(err))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := fromStatus(ctx, status.Error(codes.Canceled, "x")); !errors.Is(err, ErrTimeout) {
		t.Errorf("canceled call = %v, want timeout class", err)
	}
}

func TestSecret_Redacts(t *testing.T) {
	s := Secret("hunter2")
	n := Node{Name: "n", Password: s}
	for _, out := range []string{fmt.Sprint(s), fmt.Sprintf("%v %+v %#v %s", n, n, n, s)} {
		if strings.Contains(out, "hunter2") {
			t.Errorf("secret printed: %s", out)
		}
	}
	if s.Reveal() != "hunter2" {
		t.Errorf("Reveal() = %q", s.Reveal())
	}
}
