package ipmi

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/bougou/go-ipmi/pkg/client"
	"github.com/bougou/go-ipmi/pkg/types"

	"github.com/obmesh/obmesh/plugins/sdk"
)

// classify turns a go-ipmi error into a classified sdk error. It is the one
// place that knows go-ipmi's error shapes. what says what was being done.
func classify(ctx context.Context, what string, err error) error {
	if err == nil {
		return nil
	}
	var se *sdk.Error
	if errors.As(err, &se) {
		return err
	}
	msg := err.Error()
	wrap := func(base *sdk.Error) error {
		return &sdk.Error{Class: base.Class, Msg: fmt.Sprintf("ipmi: %s: %s", what, msg)}
	}
	var re *types.ResponseError
	switch {
	case errors.Is(err, client.ErrRAKPAuthentication),
		strings.Contains(msg, "Unauthorized name"), strings.Contains(msg, "RMCP+ status 0x0d"),
		strings.Contains(msg, "Invalid integrity check value"), strings.Contains(msg, "RAKP authentication failed"),
		strings.Contains(msg, "authentication code mismatch"):
		return wrap(sdk.ErrAuth)
	case strings.Contains(msg, "Requested maximum privilege level"), strings.Contains(msg, "Unauthorized role"),
		strings.Contains(msg, "RMCP+ status 0x09"):
		return wrap(sdk.ErrPrivilege)
	case errors.As(err, &re):
		switch re.CompletionCode() {
		case 0xd4: // insufficient privilege
			return wrap(sdk.ErrPrivilege)
		case 0xc0, 0xc3: // node busy, timeout while processing
			return wrap(sdk.ErrBusy)
		case 0xc1, 0xc2, 0xcc, 0xd5, 0xd6: // invalid command, command not supported in present state or configuration
			return wrap(sdk.ErrUnsupported)
		case 0xc9, 0xc7, 0xc8: // parameter out of range, request length invalid
			return wrap(sdk.ErrInvalid)
		}
		return wrap(sdk.ErrProtocol)
	case neverAnswered(msg):
		// Silence, not a bad answer: checked before the deadline, which a
		// blackholed BMC's retries run up against.
		return wrap(sdk.ErrUnreachable)
	case errors.Is(err, context.DeadlineExceeded), ctx.Err() != nil:
		return wrap(sdk.ErrTimeout)
	case strings.Contains(msg, "connection refused"), strings.Contains(msg, "i/o timeout"),
		strings.Contains(msg, "UDP exchange error"), strings.Contains(msg, "no route to host"),
		strings.Contains(msg, "network is unreachable"), strings.Contains(msg, "read from conn failed"),
		strings.Contains(msg, "no such host"):
		return wrap(sdk.ErrUnreachable)
	}
	return wrap(sdk.ErrProtocol)
}

// suiteUnsupported reports whether a connect error says the BMC refused
// the cipher suite (so the next suite is worth trying), as opposed to
// refusing the credentials or not answering.
func suiteUnsupported(err error) bool {
	msg := err.Error()
	return !errors.Is(err, client.ErrRAKPAuthentication) && !strings.Contains(msg, "RAKP authentication failed") &&
		(strings.Contains(msg, "Open Session failed") || strings.Contains(msg, "RMCP+ status 0x11") ||
			strings.Contains(msg, "invalid authentication algorithm") || strings.Contains(msg, "unpacked data is too short"))
}

// neverAnswered reports whether a go-ipmi error says the BMC sent nothing
// back: every retry of a request went unanswered, or the very first request
// of a session (Get Channel Authentication Capabilities) was still waiting
// when the deadline passed. A BMC that is off the network, blackholed or
// not listening on UDP 623 looks like this.
func neverAnswered(msg string) bool {
	switch {
	case strings.Contains(msg, "no datagram matched"),
		strings.Contains(msg, "no matching IPMI response"),
		strings.Contains(msg, "no UDP datagram matched"),
		strings.Contains(msg, "UDP read timed out waiting for BMC response"):
		return true
	case strings.Contains(msg, "Get Channel Authentication Capabilities failed") &&
		strings.Contains(msg, "deadline exceeded while exchanging with BMC"):
		return true
	}
	return false
}

// sessionError says in one line what an operator can act on when a
// session cannot be opened: wrong credentials, a BMC that does not answer,
// one that refuses the connection. Other classes keep go-ipmi's account.
func sessionError(endpoint string, classified, raw error) error {
	msg := raw.Error()
	switch {
	case errors.Is(classified, sdk.ErrAuth) && strings.Contains(msg, "Unauthorized name"):
		return sdk.Errorf(sdk.ClassAuth, "authentication failed at %s: the BMC has no user of that name", endpoint)
	case errors.Is(classified, sdk.ErrAuth):
		return sdk.Errorf(sdk.ClassAuth, "authentication failed at %s: wrong user name or password", endpoint)
	case errors.Is(classified, sdk.ErrPrivilege):
		return sdk.Errorf(sdk.ClassPrivilege, "the BMC at %s refused the privilege level asked for: give the user the ADMINISTRATOR or OPERATOR role, or set the privilege option", endpoint)
	case errors.Is(classified, sdk.ErrUnreachable) && strings.Contains(msg, "connection refused"):
		return sdk.Errorf(sdk.ClassUnreachable, "the BMC at %s refused the connection: nothing listens for IPMI on that port", endpoint)
	case errors.Is(classified, sdk.ErrUnreachable):
		return sdk.Errorf(sdk.ClassUnreachable, "the BMC at %s does not answer (no IPMI reply; check the address, the port and the management network)", endpoint)
	}
	return classified
}
