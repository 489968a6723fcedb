// Command obmesh is the one obmesh binary: coordinator, agent, built-in
// driver plugins, the development cluster and the operator CLI.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/obmesh/obmesh/internal/cli"
	"github.com/obmesh/obmesh/internal/daemon"
)

func main() {
	// The plugin subcommand is run by go-plugin, which manages its
	// lifetime; signals must not stop it before the host does.
	if len(os.Args) > 1 && os.Args[1] == "plugin" {
		os.Exit(daemon.Root().Execute(context.Background(), cli.OSEnv(), os.Args[1:]))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := daemon.Root().Execute(ctx, cli.OSEnv(), os.Args[1:])
	stop()
	os.Exit(code)
}
