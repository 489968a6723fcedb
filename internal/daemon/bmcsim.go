package daemon

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/obmesh/obmesh/internal/bmcsim"
	"github.com/obmesh/obmesh/internal/cli"
)

func runBMCSim(ctx context.Context, env cli.Env, args []string) int {
	fs := newFlagSet(env, "bmcsim", "bmcsim [-ipmi N] [-user U] [-o json]")
	nIPMI := fs.Int("ipmi", 4, "how many IPMI BMCs to run on 127.0.0.1")
	user := fs.String("user", "admin", "BMC user name")
	output := fs.String("o", "table", "output: table or json")
	if _, err := cli.Parse(fs, args); err != nil {
		return 2
	}
	if *nIPMI < 0 || *nIPMI > 20000 {
		return fail(env, "bmcsim", fmt.Errorf("-ipmi must be between 0 and 20000"))
	}
	password := env.Getenv("OBMESH_BMC_PASSWORD")
	if password == "" {
		password = "password"
	}
	fleet, err := bmcsim.StartIPMIFleet(*nIPMI, "ipmi", *user, password)
	if err != nil {
		return fail(env, "bmcsim", err)
	}
	defer fleet.Close()
	type row struct {
		Name, Driver, Address, Username string
	}
	var rows []row
	for _, b := range fleet.IPMI {
		rows = append(rows, row{b.Name, "ipmi", b.Addr, b.User})
	}
	if *output == "json" {
		enc := json.NewEncoder(env.Stdout)
		enc.SetIndent("", "  ")
		enc.Encode(rows)
	} else {
		fmt.Fprintf(env.Stdout, "%d IPMI BMC(s) on loopback (user %q; password from OBMESH_BMC_PASSWORD, default \"password\"):\n", len(rows), *user)
		for _, r := range rows {
			fmt.Fprintf(env.Stdout, "  %-10s %s\n", r.Name, r.Address)
		}
		fmt.Fprintln(env.Stdout, "Press Ctrl-C to stop.")
	}
	<-ctx.Done()
	return 0
}
