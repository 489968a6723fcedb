package agentsvc

import "context"

type sentHookKey struct{}

// WithSentHook returns ctx whose operation calls fn with the agent's id
// once the operation is on that agent's stream (the API reports the phase
// of an operation in flight). fn runs on the dispatching goroutine and must
// not block.
func WithSentHook(ctx context.Context, fn func(agentID string)) context.Context {
	return context.WithValue(ctx, sentHookKey{}, fn)
}

// ReportSent calls ctx's sent hook, if any. Dispatch calls it once the
// operation is on the agent's stream; other dispatchers (fakes in tests)
// may call it the same way.
func ReportSent(ctx context.Context, agentID string) {
	if fn, ok := ctx.Value(sentHookKey{}).(func(string)); ok && fn != nil {
		fn(agentID)
	}
}
