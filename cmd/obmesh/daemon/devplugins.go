package daemon

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/obmesh/obmesh/agent"
	"github.com/obmesh/obmesh/internal/config"
)

// devPlugins makes the dev agent load third-party plugins from dir (its
// [plugins] dir) beside the built-ins, rescanned every 2s and on SIGHUP, so
// a plugin author tries a driver with no CA, certificates, keyring or
// token files of their own. dir must be a directory.
func devPlugins(ac *agent.Config, dir string, stderr io.Writer) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return fmt.Errorf("-plugin-dir: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("-plugin-dir: %s is not a directory", abs)
	}
	ac.Plugins.Dir = abs
	ac.Plugins.RescanInterval = config.Duration(2 * time.Second)
	fmt.Fprintf(stderr, "obmesh dev: third-party plugins from %s (obmesh-plugin-NAME; rescanned every 2s and on SIGHUP; `obmesh agent list` shows their health)\n", abs)
	return nil
}
