package sdk

import (
	"fmt"
	"io"
	"os/exec"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
)

const (
	defaultInfoTimeout  = 5 * time.Second
	defaultCloseTimeout = 5 * time.Second
)

// StartOptions configure Start.
type StartOptions struct {
	// Logger receives the plugin's log lines; nil discards them.
	Logger hclog.Logger
	// StartTimeout bounds the handshake; zero means 10s.
	StartTimeout time.Duration
	// Stderr, if set, receives the plugin's raw stderr lines that are not
	// structured log lines.
	Stderr io.Writer
}

// Process is a driver plugin running as a child process. It is how hosts
// (the agent, sdktest) use a plugin: Driver talks to it over gRPC with
// mutual TLS (go-plugin AutoMTLS).
type Process struct {
	client *plugin.Client
	// Driver is the remote driver. Its BMCs are *RemoteBMC values.
	Driver Driver
}

// Start launches cmd as a plugin process and completes the handshake. The
// caller must Kill the process when done. cmd must not have been started.
func Start(cmd *exec.Cmd, o StartOptions) (*Process, error) {
	logger := o.Logger
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	timeout := o.StartTimeout
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	cfg := &plugin.ClientConfig{
		HandshakeConfig:  Handshake,
		Plugins:          plugin.PluginSet{pluginName: &grpcPlugin{}},
		Cmd:              cmd,
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		AutoMTLS:         true,
		Logger:           logger,
		StartTimeout:     timeout,
		Stderr:           o.Stderr,
		Managed:          false,
	}
	c := plugin.NewClient(cfg)
	rpc, err := c.Client()
	if err != nil {
		c.Kill()
		return nil, fmt.Errorf("start plugin %s: %w", cmd.Path, err)
	}
	raw, err := rpc.Dispense(pluginName)
	if err != nil {
		c.Kill()
		return nil, fmt.Errorf("start plugin %s: %w", cmd.Path, err)
	}
	return &Process{client: c, Driver: raw.(Driver)}, nil
}

// Exited reports whether the process has exited.
func (p *Process) Exited() bool { return p.client.Exited() }

// Pid returns the process id, or 0 if it is not known.
func (p *Process) Pid() int {
	if rc := p.client.ReattachConfig(); rc != nil && rc.Pid != 0 {
		return rc.Pid
	}
	return 0
}

// Kill stops the plugin process (gracefully first, then by force) and
// waits for it. It is idempotent.
func (p *Process) Kill() { p.client.Kill() }
