package cli

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// "node label n role- role=new" exited 0 and dropped role=new; a 100 KB
// value was echoed twice to stderr.
func TestNodeLabel_ConflictsAndLongValues(t *testing.T) {
	rc := &recorder{answer: func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(500) }}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	code, _, errs := runWith(t, context.Background(), srv.URL, "node", "label", "mock-2", "role-", "role=new")
	if code != 2 || len(rc.reqs) != 0 || !strings.Contains(errs, "changed twice") {
		t.Fatalf("role- role=new: exit %d, sent %v, stderr %q", code, rc.reqs, errs)
	}
	long := strings.Repeat("v", 100_000)
	code, _, errs = runWith(t, context.Background(), srv.URL, "node", "label", "mock-1", "rack="+long)
	if code != 2 || len(errs) > 500 {
		t.Fatalf("100 KB value: exit %d, %d bytes on stderr", code, len(errs))
	}
}
