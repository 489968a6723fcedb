// Command obmesh is the one obmesh binary: coordinator, agent, built-in
// driver plugins, the development cluster and the operator CLI.
//
// SIGINT and SIGTERM end the running command: a long-running one (a
// coordinator, an agent, dev, bmcsim) shuts down and exits. A second
// signal, or a shutdown that takes longer than stopGrace, exits at once.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/obmesh/obmesh/cmd/obmesh/cli"
	"github.com/obmesh/obmesh/cmd/obmesh/daemon"
)

// stopGrace bounds a shutdown after the first signal.
const stopGrace = 15 * time.Second

func main() {
	// The plugin subcommand is run by go-plugin, which manages its
	// lifetime; signals must not stop it before the host does.
	if len(os.Args) > 1 && os.Args[1] == "plugin" {
		os.Exit(daemon.Main(context.Background(), cli.OSEnv(), os.Args[1:]))
	}
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	// This goroutine lives as long as the process: it ends it when a
	// shutdown does not.
	go func() {
		sig := <-sigs
		cancel()
		select {
		case <-sigs:
			fmt.Fprintln(os.Stderr, "obmesh: second signal: exiting now")
			os.Exit(130)
		case <-time.After(stopGrace):
			fmt.Fprintf(os.Stderr, "obmesh: still running %v after signal %q; exiting now\n", stopGrace, sig)
			os.Exit(1)
		}
	}()
	code := daemon.Main(ctx, cli.OSEnv(), os.Args[1:])
	cancel()
	os.Exit(code)
}
