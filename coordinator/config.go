package coordinator

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/obmesh/obmesh/hilproxy"
	"github.com/obmesh/obmesh/internal/config"
)

// Config is a coordinator's configuration (coordinator.toml).
type Config struct {
	// Name is this coordinator's id in the Raft group.
	Name string `toml:"name"`
	// DataDir holds the Raft log, snapshots and state.
	DataDir string `toml:"data_dir"`
	// KeyringFile is the keyring that seals BMC credentials (obmesh
	// keyring create). Every coordinator of a group needs the same keys.
	KeyringFile string `toml:"keyring_file"`
	LogLevel    string `toml:"log_level"`

	HTTP       HTTPConfig       `toml:"http"`
	OBMD       OBMDConfig       `toml:"obmd"`
	Raft       RaftConfig       `toml:"raft"`
	AgentLink  AgentLinkConfig  `toml:"agent_link"`
	Operations OperationsConfig `toml:"operations"`
	Events     EventsConfig     `toml:"events"`
	Metrics    MetricsConfig    `toml:"metrics"`
}

// HTTPConfig configures the API listener.
type HTTPConfig struct {
	Listen string `toml:"listen"`
	// AdminToken or AdminTokenFile authenticates the native API.
	AdminToken     string `toml:"admin_token"`
	AdminTokenFile string `toml:"admin_token_file"`
	// TLSCert and TLSKey serve HTTPS when both are set.
	TLSCert string `toml:"tls_cert"`
	TLSKey  string `toml:"tls_key"`
	// Gate, if not nil, holds every request until it is closed (embedding
	// programs use it to finish setup, such as an import, before the first
	// request is answered).
	Gate <-chan struct{} `toml:"-"`

	// ReadHeaderTimeout bounds reading a request's headers (and the TLS
	// handshake).
	ReadHeaderTimeout config.Duration `toml:"read_header_timeout"`
	// ReadBodyTimeout bounds reading a request's body, from the end of its
	// headers. A request without a body has no body deadline.
	ReadBodyTimeout config.Duration `toml:"read_body_timeout"`
	// WriteTimeout bounds a request from the end of its headers to the
	// end of its answer; it must exceed the longest operation (?timeout=
	// is at most 5m). Console streams are exempt once authenticated.
	WriteTimeout config.Duration `toml:"write_timeout"`
	// IdleTimeout closes a kept-alive connection that sends no request.
	IdleTimeout config.Duration `toml:"idle_timeout"`
	// MaxHeaderBytes bounds a request's headers.
	MaxHeaderBytes int `toml:"max_header_bytes"`
	// MaxConnections is the most connections open at once; when reached,
	// new ones wait in the kernel's backlog until one closes.
	MaxConnections int `toml:"max_connections"`
	// MaxConnectionsPerClient is the most connections open at once from
	// one client address (IPv6: one /64); more are closed at once.
	MaxConnectionsPerClient int `toml:"max_connections_per_client"`
}

// OBMDConfig configures the obmd-compatible API (/node/...) that HIL uses.
// It is served on the API listener when an admin token is set.
type OBMDConfig struct {
	// AdminToken (32 hex digits) or AdminTokenFile authenticates obmd's
	// admin routes (HTTP Basic admin:<token>).
	AdminToken     string `toml:"admin_token"`
	AdminTokenFile string `toml:"admin_token_file"`
}

// RaftConfig configures the Raft member.
type RaftConfig struct {
	Listen    string `toml:"listen"`
	Advertise string `toml:"advertise"`
	// Bootstrap makes a fresh member start a new group with itself alone.
	Bootstrap bool `toml:"bootstrap"`
	// Expect is the number of founding members: a fresh member asks the
	// retry_join addresses who they are and, once it knows expect members,
	// all of them bootstrap the same group. A fresh member that finds an
	// existing group joins it instead (a replacement, or a wiped data dir).
	Expect int `toml:"expect"`
	// RetryJoin lists other members' agent_link addresses.
	RetryJoin []string `toml:"retry_join"`
	// SnapshotThreshold is the number of log entries between snapshots.
	SnapshotThreshold uint64 `toml:"snapshot_threshold"`
	// SnapshotInterval is how often the threshold is checked (default 2m).
	SnapshotInterval config.Duration `toml:"snapshot_interval"`
	// TrailingLogs is how many entries stay in the log after a snapshot
	// (default 10240); a member further behind gets the snapshot.
	TrailingLogs uint64 `toml:"trailing_logs"`
}

// AgentLinkConfig configures the gRPC listener agents dial.
type AgentLinkConfig struct {
	Listen string `toml:"listen"`
	// Advertise is the address agents and other coordinators dial;
	// defaults to the bound address.
	Advertise string          `toml:"advertise"`
	CAFile    string          `toml:"ca_file"`
	CertFile  string          `toml:"cert_file"`
	KeyFile   string          `toml:"key_file"`
	Heartbeat config.Duration `toml:"heartbeat"`
	AgentWait config.Duration `toml:"agent_wait"`
}

// OperationsConfig configures operations.
type OperationsConfig struct {
	DefaultTimeout config.Duration `toml:"default_timeout"`
	DefaultSite    string          `toml:"default_site"`
	// StartBy bounds when an agent may begin an operation's BMC action
	// (it refuses it later, class not_started); zero means 10s, and never
	// past the completion deadline.
	StartBy config.Duration `toml:"start_by"`
}

// EventsConfig configures BMC event subscriptions ([events]).
type EventsConfig struct {
	// AllowHTTPDestinations accepts http:// subscriber destinations
	// (https only otherwise).
	AllowHTTPDestinations bool `toml:"allow_http_destinations"`
	// ResyncInterval is how often every node's BMC subscriptions are
	// verified (±20%).
	ResyncInterval config.Duration `toml:"resync_interval"`
	// RateQPS and RateBurst bound the BMC calls of the reconciler, over
	// all BMCs.
	RateQPS   float64 `toml:"rate_qps"`
	RateBurst int     `toml:"rate_burst"`
	// DeleteTimeout bounds the removal of a subscription whose BMC cannot
	// be reached: then it is removed anyway and its BMC side cleaned later.
	DeleteTimeout config.Duration `toml:"delete_timeout"`
	// AgentGrace is how long a relay agent may be away before the BMC
	// subscriptions pointing at its relay are moved to another agent's.
	AgentGrace config.Duration `toml:"agent_grace"`
}

// DefaultConfig returns the defaults a config file is decoded over.
func DefaultConfig() Config {
	return Config{
		LogLevel: "info",
		HTTP: HTTPConfig{Listen: "127.0.0.1:8080",
			ReadHeaderTimeout: config.Duration(10 * time.Second), ReadBodyTimeout: config.Duration(time.Minute),
			WriteTimeout: config.Duration(6 * time.Minute), IdleTimeout: config.Duration(2 * time.Minute),
			MaxHeaderBytes: 64 << 10, MaxConnections: 4096, MaxConnectionsPerClient: 256},
		Raft:       RaftConfig{Listen: "127.0.0.1:7000"},
		AgentLink:  AgentLinkConfig{Listen: "127.0.0.1:7443", Heartbeat: config.Duration(2 * time.Second), AgentWait: config.Duration(5 * time.Second)},
		Operations: OperationsConfig{DefaultTimeout: config.Duration(30 * time.Second), DefaultSite: "default", StartBy: config.Duration(10 * time.Second)},
		Events: EventsConfig{ResyncInterval: config.Duration(10 * time.Minute), RateQPS: 10, RateBurst: 100,
			DeleteTimeout: config.Duration(5 * time.Minute), AgentGrace: config.Duration(30 * time.Second)},
		Metrics: MetricsConfig{OnAPI: true},
	}
}

// LoadConfig reads a coordinator config file strictly over the defaults.
func LoadConfig(path string) (Config, error) {
	c := DefaultConfig()
	if err := config.Load(path, &c); err != nil {
		return Config{}, err
	}
	return c, c.Validate()
}

// Validate checks the config and resolves the admin token file.
func (c *Config) Validate() error {
	var errs []error
	req := func(v, name string) {
		if v == "" {
			errs = append(errs, fmt.Errorf("%s is required", name))
		}
	}
	req(c.Name, "name")
	req(c.DataDir, "data_dir")
	req(c.KeyringFile, "keyring_file")
	req(c.HTTP.Listen, "http.listen")
	req(c.Raft.Listen, "raft.listen")
	req(c.AgentLink.Listen, "agent_link.listen")
	req(c.AgentLink.CAFile, "agent_link.ca_file")
	req(c.AgentLink.CertFile, "agent_link.cert_file")
	req(c.AgentLink.KeyFile, "agent_link.key_file")
	if (c.HTTP.TLSCert == "") != (c.HTTP.TLSKey == "") {
		errs = append(errs, errors.New("http.tls_cert and http.tls_key must be set together"))
	}
	if c.HTTP.AdminToken != "" && c.HTTP.AdminTokenFile != "" {
		errs = append(errs, errors.New("set http.admin_token or http.admin_token_file, not both"))
	}
	if c.HTTP.AdminToken == "" && c.HTTP.AdminTokenFile == "" {
		errs = append(errs, errors.New("http.admin_token or http.admin_token_file is required"))
	}
	if c.HTTP.AdminToken != "" && len(c.HTTP.AdminToken) < 16 {
		errs = append(errs, errors.New("http.admin_token must be at least 16 characters"))
	}
	errs = append(errs, c.HTTP.validateLimits(c.Operations.DefaultTimeout.D())...)
	if c.OBMD.AdminToken != "" && c.OBMD.AdminTokenFile != "" {
		errs = append(errs, errors.New("set obmd.admin_token or obmd.admin_token_file, not both"))
	}
	if c.OBMD.AdminToken != "" {
		if _, err := hilproxy.ParseToken(c.OBMD.AdminToken); err != nil {
			errs = append(errs, errors.New("obmd.admin_token must be 32 hex digits (obmesh keyring has none; make one with: obmd -gen-token)"))
		}
	}
	if c.Raft.Bootstrap && c.Raft.Expect > 1 {
		errs = append(errs, errors.New("raft.bootstrap (a group of one) and raft.expect > 1 contradict each other"))
	}
	if c.Raft.Expect < 0 || c.Raft.Expect > 9 {
		errs = append(errs, errors.New("raft.expect must be between 0 and 9 (use 3 or 5)"))
	}
	if !c.Raft.Bootstrap && len(c.Raft.RetryJoin) == 0 {
		errs = append(errs, errors.New("set raft.bootstrap = true for a single coordinator, or raft.expect and raft.retry_join for a group"))
	}
	if c.Events.ResyncInterval.D() < time.Second || c.Events.DeleteTimeout.D() < time.Second || c.Events.AgentGrace.D() < time.Second {
		errs = append(errs, errors.New("events.resync_interval, events.delete_timeout and events.agent_grace must be at least 1s"))
	}
	if c.Events.RateQPS <= 0 || c.Events.RateQPS > 10000 || c.Events.RateBurst < 1 || c.Events.RateBurst > 100000 {
		errs = append(errs, errors.New("events.rate_qps must be in (0, 10000] and events.rate_burst in [1, 100000]"))
	}
	if c.AgentLink.Heartbeat.D() <= 0 || c.Operations.DefaultTimeout.D() <= 0 {
		errs = append(errs, errors.New("agent_link.heartbeat and operations.default_timeout must be positive"))
	}
	return errors.Join(errs...)
}

// obmdToken returns the obmd admin token; ok is false when the obmd API is
// not configured.
func (c *Config) obmdToken() (t hilproxy.Token, ok bool, err error) {
	s := c.OBMD.AdminToken
	if c.OBMD.AdminTokenFile != "" {
		b, err := os.ReadFile(c.OBMD.AdminTokenFile)
		if err != nil {
			return t, false, fmt.Errorf("obmd admin token: %w", err)
		}
		s = strings.TrimSpace(string(b))
	}
	if s == "" {
		return t, false, nil
	}
	t, err = hilproxy.ParseToken(s)
	if err != nil {
		return t, false, fmt.Errorf("obmd admin token must be 32 hex digits")
	}
	return t, true, nil
}

// adminToken returns the configured admin token, reading the file if set.
func (c *Config) adminToken() (string, error) {
	if c.HTTP.AdminTokenFile == "" {
		return c.HTTP.AdminToken, nil
	}
	b, err := os.ReadFile(c.HTTP.AdminTokenFile)
	if err != nil {
		return "", fmt.Errorf("admin token: %w", err)
	}
	t := strings.TrimSpace(string(b))
	if len(t) < 16 {
		return "", fmt.Errorf("admin token in %s must be at least 16 characters", c.HTTP.AdminTokenFile)
	}
	return t, nil
}

// validateLimits checks the listener's timeouts and limits.
func (h *HTTPConfig) validateLimits(opTimeout time.Duration) []error {
	var errs []error
	for _, d := range []struct {
		name string
		v    config.Duration
	}{{"read_header_timeout", h.ReadHeaderTimeout}, {"read_body_timeout", h.ReadBodyTimeout}, {"write_timeout", h.WriteTimeout}, {"idle_timeout", h.IdleTimeout}} {
		if d.v.D() <= 0 {
			errs = append(errs, fmt.Errorf("http.%s must be positive", d.name))
		}
	}
	if opTimeout > 0 && h.WriteTimeout.D() > 0 && h.WriteTimeout.D() <= opTimeout {
		errs = append(errs, fmt.Errorf("http.write_timeout (%v) must exceed operations.default_timeout (%v), or answers to operations are cut off", h.WriteTimeout.D(), opTimeout))
	}
	if h.MaxHeaderBytes < 4<<10 || h.MaxHeaderBytes > 1<<20 {
		errs = append(errs, errors.New("http.max_header_bytes must be between 4096 and 1048576"))
	}
	if h.MaxConnections < 1 {
		errs = append(errs, errors.New("http.max_connections must be at least 1"))
	}
	if h.MaxConnectionsPerClient < 1 || h.MaxConnectionsPerClient > h.MaxConnections {
		errs = append(errs, errors.New("http.max_connections_per_client must be between 1 and http.max_connections"))
	}
	return errs
}
