package daemon

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/obmesh/obmesh/cmd/obmesh/cli"
)

// TokenBytes is the size of a token `obmesh token create` writes: 128
// random bits, as 32 hex digits, the form both http.admin_token_file and
// obmd.admin_token_file (obmd's own format) accept.
const TokenBytes = 16

// CreateTokenFile writes a new random token to path with mode 0600. It
// refuses to replace an existing file, so a running group's token is never
// changed by a repeated setup script.
func CreateTokenFile(path string) error {
	var b [TokenBytes]byte
	if _, err := rand.Read(b[:]); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("%s exists; it is kept (remove it first to make a new token, and give every coordinator and client the new one)", path)
	}
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintln(f, hex.EncodeToString(b[:])); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	// The umask cannot widen 0600, but a file system may ignore the mode
	// asked for; make sure.
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	return f.Close()
}

func tokenCommand() *cli.Command {
	create := func(_ context.Context, env cli.Env, args []string) int {
		fs := newFlagSet(env, "token create", "token create FILE")
		fs.Usage = func() {
			fmt.Fprintf(env.Stderr, `Usage: %s FILE

Writes a new random token (32 hex digits) to FILE with mode 0600, for
http.admin_token_file or obmd.admin_token_file. An existing FILE is kept.
The token is not printed: clients read it from the file
(export OBMESH_TOKEN=$(cat FILE)).
`, env.Path)
		}
		pos, code, ok := parse(fs, args)
		if !ok {
			return code
		}
		if len(pos) != 1 {
			fs.Usage()
			return 2
		}
		if err := CreateTokenFile(pos[0]); err != nil {
			return fail(env, "token create", err)
		}
		fmt.Fprintf(env.Stdout, "created %s (mode 0600); give every coordinator of the group the same file\n", pos[0])
		return 0
	}
	return &cli.Command{Name: "token", Synopsis: "Create the admin and obmd tokens", Subs: []*cli.Command{
		{Name: "create", Synopsis: "Write a new random token to a file (mode 0600): obmesh token create FILE", Run: create},
	}}
}
