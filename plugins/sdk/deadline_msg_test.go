package sdk

import (
	"context"
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A plugin call cut off by the operation's deadline is a timeout that says
// so, never gRPC's transport wording alone (RST_STREAM CANCEL) or a plugin
// failure.
func TestFromStatus_DeadlineCutOffSaysSo(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, e := range []error{
		status.Error(codes.Canceled, "stream error: stream ID 5; CANCEL; received from peer"),
		status.Error(codes.DeadlineExceeded, "context deadline exceeded"),
	} {
		err := fromStatus(ctx, e)
		if !errors.Is(err, ErrTimeout) || !strings.HasPrefix(err.Error(), "no answer from the BMC before the operation's deadline") {
			t.Errorf("fromStatus(%v) = %v (%s)", e, err, ClassOf(err))
		}
	}
}
