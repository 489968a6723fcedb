package sdk

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Class is the class of a driver error. Classes survive the plugin boundary
// and the agent link; hosts map them to API status codes.
type Class string

// Error classes.
const (
	ClassUnsupported Class = "unsupported"
	ClassAuth        Class = "auth"
	ClassUnreachable Class = "unreachable"
	ClassBusy        Class = "busy"
	ClassInvalid     Class = "invalid_argument"
	ClassTimeout     Class = "timeout"
	ClassProtocol    Class = "protocol"
	ClassPrivilege   Class = "privilege"
	// ClassQuota: the BMC has no room for more (subscription limit).
	ClassQuota Class = "quota_exceeded"
	// ClassConflict: the thing already exists (a BMC that allows one
	// subscription per destination).
	ClassConflict Class = "already_exists"
	// ClassOutcomeUnknown: the BMC accepted an action but its effect was
	// not seen before the deadline; it may or may not happen. The message
	// says what was observed.
	ClassOutcomeUnknown Class = "outcome_unknown"
	// ClassInternal is any driver error that is not classified.
	ClassInternal Class = "internal"
	// ClassPlugin is a failure of the plugin process itself (it exited or
	// the connection to it broke), as opposed to an error it reported.
	ClassPlugin Class = "plugin"
)

// Sentinel errors. Drivers wrap them (fmt.Errorf("...: %w", sdk.ErrAuth));
// hosts test them with errors.Is, on either side of the plugin boundary.
var (
	ErrUnsupported    = &Error{Class: ClassUnsupported, Msg: "operation not supported by this driver or BMC"}
	ErrAuth           = &Error{Class: ClassAuth, Msg: "BMC authentication failed"}
	ErrUnreachable    = &Error{Class: ClassUnreachable, Msg: "BMC unreachable"}
	ErrBusy           = &Error{Class: ClassBusy, Msg: "BMC busy"}
	ErrInvalid        = &Error{Class: ClassInvalid, Msg: "invalid argument"}
	ErrTimeout        = &Error{Class: ClassTimeout, Msg: "timed out"}
	ErrProtocol       = &Error{Class: ClassProtocol, Msg: "BMC protocol error"}
	ErrPrivilege      = &Error{Class: ClassPrivilege, Msg: "insufficient privilege on the BMC"}
	ErrQuota          = &Error{Class: ClassQuota, Msg: "BMC limit reached"}
	ErrConflict       = &Error{Class: ClassConflict, Msg: "already exists on the BMC"}
	ErrOutcomeUnknown = &Error{Class: ClassOutcomeUnknown, Msg: "the BMC accepted the action; its effect was not seen"}
	ErrPlugin         = &Error{Class: ClassPlugin, Msg: "driver plugin failed"}
)

// Error is a classified error. Two Errors match under errors.Is when their
// classes are equal, so an error rebuilt from the wire still matches the
// sentinels.
type Error struct {
	Class Class
	Msg   string
}

func (e *Error) Error() string { return e.Msg }

// Is matches any *Error of the same class.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Class == e.Class
}

// ClassOf returns the class of err: the class of the first *Error in its
// chain, ClassTimeout for context.DeadlineExceeded, ClassInternal otherwise.
func ClassOf(err error) Class {
	if err == nil {
		return ""
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Class
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return ClassTimeout
	}
	return ClassInternal
}

// Errorf returns a classified error with a formatted message.
func Errorf(c Class, format string, args ...any) error {
	return &Error{Class: c, Msg: fmt.Sprintf(format, args...)}
}

const errorDomain = "obmesh.driver"

var classCodes = map[Class]codes.Code{
	ClassUnsupported:    codes.Unimplemented,
	ClassAuth:           codes.Unauthenticated,
	ClassUnreachable:    codes.Unavailable,
	ClassBusy:           codes.ResourceExhausted,
	ClassInvalid:        codes.InvalidArgument,
	ClassTimeout:        codes.DeadlineExceeded,
	ClassProtocol:       codes.Internal,
	ClassPrivilege:      codes.PermissionDenied,
	ClassQuota:          codes.ResourceExhausted,
	ClassConflict:       codes.AlreadyExists,
	ClassOutcomeUnknown: codes.Unknown,
	ClassInternal:       codes.Unknown,
	ClassPlugin:         codes.Unknown,
}

// toStatus is the one mapping from driver errors to gRPC statuses. The class
// travels in an ErrorInfo detail so a transport failure (also codes.Unavailable)
// is never mistaken for an unreachable BMC.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	c := ClassOf(err)
	st := status.New(classCodes[c], err.Error())
	if d, derr := st.WithDetails(&errdetails.ErrorInfo{Reason: string(c), Domain: errorDomain}); derr == nil {
		st = d
	}
	return st.Err()
}

// fromStatus rebuilds a classified error from a gRPC error. Errors without
// the driver's ErrorInfo are failures of the plugin connection: ClassPlugin,
// or ClassTimeout when the caller's context ended.
func fromStatus(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return &Error{Class: ClassPlugin, Msg: "driver plugin: " + err.Error()}
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.Domain == errorDomain {
			return &Error{Class: Class(info.Reason), Msg: st.Message()}
		}
	}
	if ctx.Err() != nil || st.Code() == codes.DeadlineExceeded || st.Code() == codes.Canceled {
		return &Error{Class: ClassTimeout, Msg: "no answer from the BMC before the operation's deadline (the driver call was cut off: " + st.Message() + ")"}
	}
	return &Error{Class: ClassPlugin, Msg: "driver plugin connection failed: " + st.Message()}
}
