package archtest

import (
	"os"
	"strings"
	"testing"
)

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestPackageDocs: every package has a doc comment starting "Package x" (or
// "Command x" for mains).
func TestPackageDocs(t *testing.T) {
	for _, p := range listAll(t) {
		if !isModule(p.ImportPath) || strings.HasSuffix(p.ImportPath, "pb") {
			continue // generated protobuf packages
		}
		want := "Package " + p.Name
		if p.Name == "main" {
			want = "Command "
		}
		if !strings.HasPrefix(p.Doc, want) {
			t.Errorf("%s: package doc %q should start with %q", p.ImportPath, p.Doc, want)
		}
	}
}
