package daemon

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"time"

	"github.com/obmesh/obmesh/cmd/obmesh/cli"
	"github.com/obmesh/obmesh/coordinator/api"
	"github.com/obmesh/obmesh/hilproxy"
	"github.com/obmesh/obmesh/internal/obmddb"
)

func importCommand() *cli.Command {
	run := func(ctx context.Context, env cli.Env, args []string) int {
		fs := flag.NewFlagSet("import obmd", flag.ContinueOnError)
		fs.SetOutput(env.Stderr)
		db := fs.String("db", "", "obmd SQLite database file (required)")
		addr := fs.String("addr", env.Getenv("OBMESH_ADDR"), "coordinator API address (env OBMESH_ADDR)")
		token := fs.String("token", "", "admin token (default: env OBMESH_TOKEN; a flag is visible to other users in ps)")
		site := fs.String("site", "", "site for nodes whose obm_info names none (default: the coordinator's default site)")
		timeout := fs.Duration("timeout", 30*time.Second, "bound on each registration")
		var tf cli.TLSFiles
		fs.StringVar(&tf.CA, "ca-file", env.Getenv("OBMESH_CACERT"), "CA certificate (PEM) that signed the API's certificate (env OBMESH_CACERT)")
		fs.StringVar(&tf.Cert, "client-cert", env.Getenv("OBMESH_CLIENT_CERT"), "client certificate (PEM), if the API asks for one (env OBMESH_CLIENT_CERT)")
		fs.StringVar(&tf.Key, "client-key", env.Getenv("OBMESH_CLIENT_KEY"), "the client certificate's key (env OBMESH_CLIENT_KEY)")
		fs.Usage = func() {
			fmt.Fprintf(env.Stderr, "Usage: %s -db FILE [flags]\n\nRegisters the nodes of an obmd SQLite database in a running cluster. Nodes already registered are skipped, so it can be run again.\n\nFlags:\n", env.Path)
			fs.PrintDefaults()
		}
		pos, code, ok := parse(fs, args)
		if !ok {
			return code
		}
		if len(pos) > 0 {
			return cli.Usagef(env, "unexpected argument %q", pos[0])
		}
		if *token == "" {
			*token = env.Getenv("OBMESH_TOKEN")
		}
		if *db == "" || *addr == "" || *token == "" {
			return cli.Usagef(env, "-db, and OBMESH_ADDR and OBMESH_TOKEN (or -addr, -token) are required")
		}
		rows, err := obmddb.ReadNodes(*db)
		if err != nil {
			return fail(env, "import obmd", err)
		}
		hc, err := cli.NewHTTPClient(tf)
		if err != nil {
			return fail(env, "import obmd", err)
		}
		c := api.NewClient(*addr, *token, hc)
		imported, skipped, failed := 0, 0, 0
		fmt.Fprintf(env.Stdout, "%s: %d node(s)\n", *db, len(rows))
		for i, r := range rows {
			prefix := fmt.Sprintf("[%d/%d] %s:", i+1, len(rows), r.Label)
			spec, err := hilproxy.SpecFromOBM(r.Label, []byte(r.OBMInfo))
			if err != nil {
				skipped++
				fmt.Fprintf(env.Stdout, "%s skipped: its obm_info is not valid: %v\n", prefix, err)
				continue
			}
			if spec.Site == "" {
				spec.Site = *site
			}
			rctx, cancel := context.WithTimeout(ctx, *timeout)
			_, err = c.RegisterNode(rctx, spec)
			if err == nil {
				imported++
				fmt.Fprintf(env.Stdout, "%s imported (driver %s)\n", prefix, spec.Driver)
				cancel()
				continue
			}
			var ae *api.Error
			if errors.As(err, &ae) && ae.Code == api.CodeAlreadyExists {
				skipped++
				have, gerr := c.Node(rctx, r.Label)
				switch {
				case gerr != nil:
					fmt.Fprintf(env.Stdout, "%s skipped: already registered\n", prefix)
				case same(have, spec):
					fmt.Fprintf(env.Stdout, "%s skipped: already registered with the same settings\n", prefix)
				default:
					fmt.Fprintf(env.Stdout, "%s skipped: a different node of this name exists (driver %s, address %s); delete it first to import this one\n", prefix, have.Driver, have.Address)
				}
				cancel()
				continue
			}
			cancel()
			failed++
			fmt.Fprintf(env.Stdout, "%s failed: %v\n", prefix, err)
		}
		fmt.Fprintf(env.Stdout, "%d imported, %d skipped, %d failed\n", imported, skipped, failed)
		if failed > 0 {
			return 1
		}
		return 0
	}
	return &cli.Command{Name: "import", Synopsis: "Import nodes from other systems", Subs: []*cli.Command{
		{Name: "obmd", Synopsis: "Import an obmd SQLite database: obmesh import obmd -db FILE", Run: run},
	}}
}

// same compares what an import can compare (the password is sealed).
func same(n api.Node, s api.NodeSpec) bool {
	return n.Driver == s.Driver && n.Address == s.Address && n.Username == s.Username &&
		(s.Site == "" || n.Site == s.Site) && maps.Equal(n.Options, s.Options) && n.HasPassword == (s.Password != "")
}
