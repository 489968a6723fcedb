package cli

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/obmesh/obmesh/coordinator/api"
)

// Error classes of failures that happen on the CLI's side of the API (API
// errors carry their own code, an api.Code* constant).
const (
	classUsage       = "usage"
	classUnreachable = "api_unreachable" // the API could not be reached at all
	classTLS         = "tls"
	classTimeout     = "timeout"     // -timeout passed with no answer
	classInterrupted = "interrupted" // Ctrl-C
	classError       = "error"
)

// gaveUp is an operation the CLI stopped waiting for (timeout or
// interrupt): it may or may not have been carried out.
type gaveUp struct {
	id, node, action string
	why              string // classTimeout or classInterrupted
	after            string // the -timeout, for the message
	sent             bool   // the request was written to the API
}

func (g *gaveUp) Error() string {
	var b strings.Builder
	if g.why == classInterrupted {
		b.WriteString("interrupted before the answer")
	} else {
		fmt.Fprintf(&b, "no answer within -timeout %s", g.after)
	}
	switch {
	case g.id != "":
		fmt.Fprintf(&b, "; the operation may still be carried out: receipt %s (obmesh operation show %s)", g.id, g.id)
	case g.sent:
		b.WriteString("; the coordinator never named the operation, so it may not have started: check obmesh operation list -node " + g.node + " -since 5m")
	default:
		b.WriteString("; the request was not sent, nothing was started")
	}
	return b.String()
}

// describe splits an error into its class, a one-line message and the
// exit code.
func describe(err error) (class, msg string, code int) {
	var ae *api.Error
	var g *gaveUp
	var unknownCA x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	var ne net.Error
	var ue *url.Error
	var usage *usageError
	var cf *checkFailed
	var ec exitCoder
	switch {
	case errors.As(err, &ec): // job.go
		return ec.class(), ec.Error(), ec.exitCode()
	case errors.As(err, &usage):
		return classUsage, usage.Error(), 2
	case errors.As(err, &cf):
		class, msg, _ := describe(cf.err)
		return class, fmt.Sprintf("node %s is registered, but its BMC check failed: %s (fix it with obmesh node update %s)", cf.node, msg, cf.node), 1
	case errors.As(err, &g):
		code = 1
		if g.sent || g.id != "" {
			code = 3
		}
		return g.why, g.Error(), code
	case errors.As(err, &ae):
		msg = ae.Message
		if ae.Receipt != nil && ae.Receipt.ID != "" && !strings.Contains(msg, ae.Receipt.ID) {
			msg += " (receipt " + ae.Receipt.ID + ")"
		}
		if msg == "" {
			msg = fmt.Sprintf("HTTP %d", ae.StatusCode)
		}
		code = 1
		if ae.Code == api.CodeOutcomeUnknown {
			code = 3
		}
		return ae.Code, msg, code
	case errors.Is(err, context.DeadlineExceeded):
		return classTimeout, "no answer before -timeout", 1
	case errors.Is(err, context.Canceled):
		return classInterrupted, "interrupted", 1
	case errors.As(err, &unknownCA), errors.As(err, &host), errors.As(err, &invalid),
		strings.Contains(err.Error(), "certificate required"), strings.Contains(err.Error(), "server gave HTTP response to HTTPS client"):
		return classTLS, trimTransport(err), 1
	case errors.As(err, &ue), errors.As(err, &ne):
		return classUnreachable, trimTransport(err), 1
	}
	return classError, err.Error(), 1
}

// trimTransport shortens Go's transport errors ("obmesh API http://x: Post
// \"http://x/v1/...\": dial tcp ...: connect: connection refused") to what
// matters: the API's address and the cause.
func trimTransport(err error) string {
	msg := err.Error()
	var ue *url.Error
	if errors.As(err, &ue) {
		base := ue.URL
		if u, perr := url.Parse(ue.URL); perr == nil {
			base = u.Scheme + "://" + u.Host
		}
		inner := ue.Err.Error()
		var oe *net.OpError
		if errors.As(ue.Err, &oe) && oe.Err != nil {
			inner = oe.Err.Error()
		}
		msg = "cannot reach the API at " + base + ": " + inner
		// Keep the operator's hint (tlsHint) if there is one.
		if i := strings.LastIndex(err.Error(), " ("); i > 0 && strings.HasSuffix(err.Error(), ")") && !strings.Contains(inner, err.Error()[i:]) {
			msg += err.Error()[i:]
		}
	}
	return msg
}

// reportError prints err as one line, "<path>: <class>: <message>" (and,
// in JSON mode, a failed operation's receipt on stdout), and returns the
// exit code: 1 failed, 3 outcome unknown.
func reportError(env Env, output string, err error) int {
	class, msg, code := describe(err)
	if output == "json" {
		var ae *api.Error
		var g *gaveUp
		switch {
		case errors.As(err, &ae) && ae.Receipt != nil:
			printJSON(env.Stdout, ae.Receipt)
		case errors.As(err, &g) && g.id != "":
			printJSON(env.Stdout, api.Receipt{ID: g.id, Node: g.node, Action: g.action, Outcome: api.OutcomeUnknown,
				ErrorClass: g.why, Error: g.Error(), Timings: []api.Timing{}})
		}
	}
	fmt.Fprintf(env.Stderr, "%s: %s: %s\n", env.path(), termText(class), termText(oneLine(msg)))
	return code
}

// oneLine joins a multi-line message.
func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " ")), " ")
}
