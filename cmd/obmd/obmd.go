// Run (this file) runs obmesh as a drop-in replacement for obmd: one
// process with a single-member coordinator, an agent and the driver
// plugins, serving obmd's API (and obmesh's own) on obmd's listen address,
// configured the ways obmd was. An existing obmd SQLite database is
// imported on first start.

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/obmesh/obmesh/cmd/obmesh/daemon"
	"github.com/obmesh/obmesh/coordinator"
	"github.com/obmesh/obmesh/hilproxy"
	"github.com/obmesh/obmesh/internal/obmddb"
)

// importedMarker records that the first-start import finished.
const importedMarker = "obmd-import-done"

// Options configure Run beyond obmd's Config.
type Options struct {
	Logger *slog.Logger
	// PluginCommand overrides how plugins are started (tests).
	PluginCommand func(name string) *exec.Cmd
	// Ready, if not nil, is called with the API address once serving.
	Ready func(addr string)
}

// Run serves until ctx ends.
func Run(ctx context.Context, c Config, o Options) error {
	log := o.Logger
	var dir string
	if c.DBPath == ":memory:" {
		d, err := os.MkdirTemp("", "obmd-memory-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dir = d
	} else {
		dir = c.DBPath + ".obmesh"
	}
	fresh := false
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		fresh = true
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	cc, ac, err := daemon.DevSetup(dir, c.ListenAddr)
	if err != nil {
		return err
	}
	cc.Name = "obmd"
	cc.OBMD.AdminTokenFile = ""
	cc.OBMD.AdminToken = c.AdminToken
	cc.HTTP.TLSCert, cc.HTTP.TLSKey = c.TLSCert, c.TLSKey
	cc.LogLevel = "info"
	ac.ID = "dev-agent"
	ac.PluginCommand = o.PluginCommand
	// Like obmd, answer no request before the database is loaded.
	gate := make(chan struct{})
	cc.HTTP.Gate = gate

	local, err := daemon.StartLocal(ctx, cc, ac, log)
	if err != nil {
		return err
	}
	defer local.Stop()
	coord := local.Coord
	if c.DBPath != ":memory:" {
		if _, err := os.Stat(filepath.Join(dir, importedMarker)); errors.Is(err, os.ErrNotExist) {
			if err := importDB(ctx, coord, c.DBPath, dir, fresh, log); err != nil {
				return err
			}
		}
	}
	close(gate)
	log.Info("obmd (obmesh) serving", "addr", coord.HTTPAddr(), "state", dir)
	if o.Ready != nil {
		o.Ready(coord.HTTPAddr())
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-local.Err():
		return err
	}
}

// importDB registers the nodes of an existing obmd database, once.
func importDB(ctx context.Context, coord *coordinator.Server, dbPath, dir string, fresh bool, log *slog.Logger) error {
	if _, err := os.Stat(dbPath); errors.Is(err, os.ErrNotExist) {
		// obmd would create an empty database here; there is nothing to import.
		return os.WriteFile(filepath.Join(dir, importedMarker), []byte("no database\n"), 0o600)
	}
	rows, err := obmddb.ReadNodes(dbPath)
	if err != nil {
		return fmt.Errorf("import obmd database: %w", err)
	}
	ictx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	imported, skipped := 0, 0
	for _, r := range rows {
		spec, err := hilproxy.SpecFromOBM(r.Label, []byte(r.OBMInfo))
		if err == nil {
			err = coord.RegisterNode(ictx, spec)
		}
		switch {
		case err == nil:
			imported++
		case errors.Is(err, coordinator.ErrNodeExists):
			skipped++
		default:
			// obmd itself refused to start on a row it could not parse.
			return fmt.Errorf("import obmd database: node %q: %w", r.Label, err)
		}
	}
	log.Info("imported obmd database", "db", dbPath, "imported", imported, "already_present", skipped, "first_start", fresh)
	return os.WriteFile(filepath.Join(dir, importedMarker), fmt.Appendf(nil, "imported %d nodes from %s\n", imported, dbPath), 0o600)
}
