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

// reportSent calls ctx's sent hook, if any.
func reportSent(ctx context.Context, agentID string) {
	if fn, ok := ctx.Value(sentHookKey{}).(func(string)); ok && fn != nil {
		fn(agentID)
	}
}
