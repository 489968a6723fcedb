package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/obmesh/obmesh/cmd/obmesh/cli"
	"github.com/obmesh/obmesh/tests/bmcsim"
)

func runBMCSim(ctx context.Context, env cli.Env, args []string) int {
	fs := cli.NewFlagSet(env, "[-ipmi N] [-redfish N] [-mockup NAME] [-user U] [-o json]",
		"Runs simulated BMCs on loopback until interrupted and prints their addresses: IPMI BMCs share one UDP port, each on an address of its own in 127.77.0.0/16 (on Linux), Redfish BMCs listen on 127.0.0.1. By default 4 IPMI BMCs and no Redfish BMC; every BMC accepts the user -user (admin) with the password from OBMESH_BMC_PASSWORD, or \"password\" when it is unset. Redfish BMCs serve HTTPS with a certificate of their own (its SHA-256 fingerprint is printed).")
	nIPMI := fs.Int("ipmi", 4, "how many IPMI BMCs to run on loopback")
	nRedfish := fs.Int("redfish", 0, "how many Redfish BMCs (HTTPS, DMTF mockup) to run on 127.0.0.1")
	mockup := fs.String("mockup", "public-rackmount1", "DMTF mockup the Redfish BMCs serve: "+strings.Join(bmcsim.Mockups(), ", "))
	user := fs.String("user", "admin", "BMC user name")
	output := fs.String("o", "table", "output: table or json")
	pos, code, ok := parse(fs, args)
	if !ok {
		return code
	}
	if len(pos) > 0 {
		return cli.Usagef(env, "unexpected argument %q", pos[0])
	}
	if *nIPMI < 0 || *nIPMI > 20000 {
		return fail(env, "bmcsim", fmt.Errorf("-ipmi must be between 0 and 20000"))
	}
	if *nRedfish < 0 || *nRedfish > 5000 {
		return fail(env, "bmcsim", fmt.Errorf("-redfish must be between 0 and 5000"))
	}
	mockupDir, err := bmcsim.MockupDir(*mockup)
	if err != nil {
		return fail(env, "bmcsim", err)
	}
	password := env.Getenv("OBMESH_BMC_PASSWORD")
	if password == "" {
		password = "password"
	}
	// One UDP socket for all the IPMI BMCs, each on its own loopback
	// address (127.77.x.y); a socket per BMC where that is not available.
	fleet, err := bmcsim.StartIPMIFleetShared(*nIPMI, "ipmi", *user, password)
	if err != nil {
		fleet, err = bmcsim.StartIPMIFleet(*nIPMI, "ipmi", *user, password)
	}
	if err != nil {
		return fail(env, "bmcsim", err)
	}
	defer fleet.Close()
	type row struct {
		Name, Driver, Address, Username string
		// Fingerprint is a Redfish BMC's certificate SHA-256 (its
		// fingerprint option).
		Fingerprint string `json:",omitempty"`
	}
	var rows []row
	for _, b := range fleet.IPMI {
		rows = append(rows, row{Name: b.Name, Driver: "ipmi", Address: b.Addr, Username: b.User})
	}
	for i := 1; i <= *nRedfish; i++ {
		rf, err := bmcsim.StartRedfish(bmcsim.RedfishConfig{Mockup: mockupDir, TransitionDelay: time.Second,
			Users: map[string]bmcsim.RedfishUser{*user: {Password: password, Role: "Administrator"}}})
		if err != nil {
			return fail(env, "bmcsim", err)
		}
		defer rf.Close()
		rows = append(rows, row{Name: fmt.Sprintf("redfish-%d", i), Driver: "redfish", Address: rf.URL, Username: *user, Fingerprint: rf.Fingerprint})
	}
	if *output == "json" {
		enc := json.NewEncoder(env.Stdout)
		enc.SetIndent("", "  ")
		enc.Encode(rows)
	} else {
		fmt.Fprintf(env.Stdout, "%d IPMI and %d Redfish BMC(s) on loopback (user %q; password from OBMESH_BMC_PASSWORD, default \"password\"):\n", len(fleet.IPMI), *nRedfish, *user)
		for _, r := range rows {
			fmt.Fprintf(env.Stdout, "  %-12s %-8s %s\n", r.Name, r.Driver, r.Address)
			if r.Fingerprint != "" {
				fmt.Fprintf(env.Stdout, "  %-12s %-8s -option fingerprint=%s\n", "", "", r.Fingerprint)
			}
		}
		fmt.Fprintln(env.Stdout, "Press Ctrl-C to stop.")
	}
	<-ctx.Done()
	return 0
}
