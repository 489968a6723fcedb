package archtest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/obmesh/obmesh/agent"
	"github.com/obmesh/obmesh/coordinator"
)

// TestExampleConfigs loads every file in configs/ with the strict loader of
// the binary it belongs to, so the examples cannot drift from the code.
func TestExampleConfigs(t *testing.T) {
	dir := filepath.Join(root(t), "configs")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	loaded := 0
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		switch {
		case strings.HasPrefix(e.Name(), "coordinator") && strings.HasSuffix(e.Name(), ".toml"):
			if _, err := coordinator.LoadConfig(path); err != nil {
				t.Errorf("%s: %v", e.Name(), err)
			}
		case strings.HasPrefix(e.Name(), "agent") && strings.HasSuffix(e.Name(), ".toml"):
			if _, err := agent.LoadConfig(path); err != nil {
				t.Errorf("%s: %v", e.Name(), err)
			}
		default:
			t.Errorf("%s: no loader knows this example; add one here", e.Name())
			continue
		}
		loaded++
	}
	if loaded < 2 {
		t.Errorf("loaded %d example configs, want at least coordinator.toml and agent.toml", loaded)
	}
}

func TestConfigs_UnknownKeyNamed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.toml")
	os.WriteFile(path, []byte("name = \"x\"\nlisten_addr = \"oops\"\n"), 0o600)
	_, err := coordinator.LoadConfig(path)
	if err == nil || !strings.Contains(err.Error(), "listen_addr") {
		t.Errorf("LoadConfig(unknown key) = %v, want an error naming listen_addr", err)
	}
}
