package cli

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/obmesh/obmesh/coordinator/api"
)

func operatorCommand() *Command {
	list := apiCommand("list-peers", "List the coordinator group with each member's health.", "", 0, nil,
		func(ctx context.Context, env Env, c *api.Client, f *clientFlags, _ []string) error {
			ps, err := c.Peers(ctx)
			if err != nil {
				return err
			}
			if f.output == "json" {
				printJSON(env.Stdout, ps)
				return nil
			}
			var rows [][]string
			for _, p := range ps {
				role := "follower"
				if p.Leader {
					role = "leader"
				}
				if !p.Voter {
					role += " (non-voter)"
				}
				health := "healthy"
				if !p.Healthy {
					health = "unhealthy"
					if p.Error != "" {
						health += ": " + p.Error
					}
				}
				rows = append(rows, []string{p.ID, p.Address, role, strconv.FormatUint(p.AppliedIndex, 10), strconv.FormatInt(p.LastContactMS, 10), health})
			}
			table(env.Stdout, "ID\tRAFT ADDRESS\tROLE\tAPPLIED\tLAST CONTACT (ms)\tHEALTH", rows)
			return nil
		})
	add := apiCommand("add-peer", "Add a voting member by id and Raft address.", "ID RAFT_ADDRESS", 2, nil,
		func(ctx context.Context, env Env, c *api.Client, f *clientFlags, args []string) error {
			if err := c.AddPeer(ctx, args[0], args[1]); err != nil {
				return err
			}
			fmt.Fprintf(env.Stdout, "added %s at %s\n", termText(args[0]), termText(args[1]))
			return nil
		})
	remove := apiCommand("remove-peer", "Remove a member (a dead one, or one being retired).", "ID", 1, nil,
		func(ctx context.Context, env Env, c *api.Client, f *clientFlags, args []string) error {
			if err := c.RemovePeer(ctx, args[0]); err != nil {
				return err
			}
			fmt.Fprintf(env.Stdout, "removed %s\n", termText(args[0]))
			return nil
		})
	return &Command{Name: "operator", Synopsis: "Manage the coordinator group", Subs: []*Command{
		{Name: "raft", Synopsis: "Raft membership", Subs: []*Command{list, add, remove}},
	}}
}

func snapshotCommand() *Command {
	save := apiCommand("save", "Save the replicated state to FILE.", "FILE", 1, nil,
		func(ctx context.Context, env Env, c *api.Client, f *clientFlags, args []string) error {
			var buf bytes.Buffer
			if err := c.SnapshotSave(ctx, &buf); err != nil {
				return err
			}
			if err := writePrivateFile(args[0], buf.Bytes()); err != nil {
				return err
			}
			fmt.Fprintf(env.Stdout, "saved %d bytes to %s (credentials stay sealed: keep the keyring to restore them)\n", buf.Len(), args[0])
			return nil
		})
	restore := apiCommand("restore", "Replace nodes, sites and agents with a saved snapshot.", "FILE", 1, nil,
		func(ctx context.Context, env Env, c *api.Client, f *clientFlags, args []string) error {
			b, err := os.ReadFile(args[0])
			if err != nil {
				return err
			}
			if err := c.SnapshotRestore(ctx, b); err != nil {
				return err
			}
			fmt.Fprintf(env.Stdout, "restored %s\n", args[0])
			return nil
		})
	return &Command{Name: "snapshot", Synopsis: "Save and restore the replicated state", Subs: []*Command{save, restore}}
}

// writePrivateFile writes data to path readable by its owner only (0600),
// also when path already exists with a wider mode: the data goes to a new
// 0600 file in the same directory that then replaces path, so a reader never
// sees a partial file and an old mode is never reused.
func writePrivateFile(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after a successful rename there is nothing to remove
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
