// Command obmd is obmesh as a drop-in for the original obmd: the same
// configuration (a -config JSON file as in v0.1/v0.2, or the environment
// variables of the last release), the same API, and its SQLite database
// imported on first start.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/obmesh/obmesh/cmd/obmesh/daemon"
	"github.com/obmesh/obmesh/hilproxy"
	"github.com/obmesh/obmesh/internal/logging"
	"github.com/obmesh/obmesh/plugins/sdk"
)

func main() {
	// The agent runs built-in drivers by re-executing this binary.
	if len(os.Args) == 3 && os.Args[1] == "plugin" {
		d, ok := daemon.Builtin(os.Args[2])
		if !ok {
			log.Fatalf("no built-in driver %q", os.Args[2])
		}
		sdk.Serve(d)
		return
	}
	genToken := flag.Bool("gen-token", false, "print a new random token and exit")
	configPath := flag.String("config", "", "obmd v0.1/v0.2 JSON config file (default: configure from the environment)")
	flag.Parse()
	if *genToken {
		fmt.Println(hilproxy.NewToken())
		return
	}
	var cfg Config
	var err error
	if *configPath != "" {
		cfg, err = LoadFile(*configPath)
	} else {
		cfg, err = FromEnv(os.Getenv)
	}
	if err != nil {
		log.Fatal(err)
	}
	logger, _ := logging.New(os.Stderr, os.Getenv("OBMD_LOG_LEVEL"))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := Run(ctx, cfg, Options{Logger: logger}); err != nil {
		stop()
		log.Fatal(err)
	}
}
