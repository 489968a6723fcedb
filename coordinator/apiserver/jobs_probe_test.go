package apiserver

import (
	"testing"

	"github.com/obmesh/obmesh/coordinator/api"
)

// A key both set and removed was applied sets-first: the set was lost.
func TestLabels_AKeySetAndRemovedIsRefused(t *testing.T) {
	f := newFixture(t)
	if code, eb, _ := f.do(t, "POST", "/v1/nodes", `{"name":"n1","driver":"mock","labels":{"role":"old"}}`, token); code != 201 {
		t.Fatalf("register: %d %+v", code, eb)
	}
	code, eb, _ := f.do(t, "PATCH", "/v1/nodes/n1/labels", `{"set":{"role":"new"},"remove":["role"]}`, token)
	if code != 400 || eb.Error.Code != api.CodeInvalidArgument {
		t.Fatalf("set and remove role: %d %+v, want 400", code, eb)
	}
	if got, _ := f.st.State().Node("n1"); got.Labels["role"] != "old" {
		t.Fatalf("labels changed: %v", got.Labels)
	}
}
