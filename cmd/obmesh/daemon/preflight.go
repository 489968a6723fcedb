package daemon

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"

	"github.com/obmesh/obmesh/agent"
	"github.com/obmesh/obmesh/coordinator"
	"github.com/obmesh/obmesh/internal/tlsutil"
)

// secretFile is a file that holds a secret: a token, a keyring or a
// private key. It must exist and be accessible to its owner only.
type secretFile struct {
	what, path string
	// create is the command that makes the file, for the message when it
	// is missing.
	create string
}

// checkSecretFiles refuses files that are missing or that group or others
// may access, each with the command that fixes it.
func checkSecretFiles(files []secretFile) error {
	var errs []error
	for _, f := range files {
		if f.path == "" {
			continue
		}
		fi, err := os.Stat(f.path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			msg := fmt.Sprintf("%s %s does not exist", f.what, f.path)
			if f.create != "" {
				msg += "; create it with: " + f.create
			}
			errs = append(errs, errors.New(msg))
		case err != nil:
			errs = append(errs, fmt.Errorf("%s: %w", f.what, err))
		case fi.IsDir():
			errs = append(errs, fmt.Errorf("%s %s is a directory, not a file", f.what, f.path))
		case fi.Mode().Perm()&0o077 != 0:
			errs = append(errs, fmt.Errorf("%s %s is accessible by group or others (mode %04o); it holds a secret: run chmod 600 %s (and chown it to the user obmesh runs as)",
				f.what, f.path, fi.Mode().Perm(), f.path))
		}
	}
	return errors.Join(errs...)
}

// coordinatorSecrets lists a coordinator's secret files; the config file
// itself is one when it holds a token inline.
func coordinatorSecrets(c coordinator.Config, configPath string) []secretFile {
	files := []secretFile{
		{"http.admin_token_file", c.HTTP.AdminTokenFile, "obmesh token create " + c.HTTP.AdminTokenFile},
		{"obmd.admin_token_file", c.OBMD.AdminTokenFile, "obmesh token create " + c.OBMD.AdminTokenFile},
		{"keyring_file", c.KeyringFile, "obmesh keyring create " + c.KeyringFile},
		{"agent_link.key_file", c.AgentLink.KeyFile, "obmesh tls cert create -coordinator -name " + c.Name + " -hosts HOST,..."},
		{"http.tls_key", c.HTTP.TLSKey, "obmesh tls cert create -api -hosts HOST,..."},
	}
	if c.HTTP.AdminToken != "" || c.OBMD.AdminToken != "" {
		files = append(files, secretFile{"config file (it holds a token)", configPath, ""})
	}
	return files
}

// agentSecrets lists an agent's secret files.
func agentSecrets(c agent.Config) []secretFile {
	files := []secretFile{{"tls.key_file", c.TLS.KeyFile, "obmesh tls cert create -agent -name " + c.ID + " -sites " + strings.Join(c.Sites, ",")}}
	if c.Relay.Enabled() {
		files = append(files, secretFile{"relay.key_file", c.Relay.KeyFile, ""})
	}
	return files
}

// hostOf returns the host of a host:port address, or "" when it has none
// a client could dial (empty, unspecified, or not host:port).
func hostOf(addr string) string {
	h, _, err := net.SplitHostPort(addr)
	if err != nil || tlsutil.IsUnspecified(h) {
		return ""
	}
	return h
}

// coordinatorCertWarnings checks the coordinator's certificates against
// the addresses it tells others: a certificate that does not cover them
// makes agents and members retry forever with a certificate error, so it
// is said once, at start, here.
func coordinatorCertWarnings(c coordinator.Config) []string {
	var warns []string
	reissue := func(hosts ...string) string {
		return fmt.Sprintf("reissue it with: obmesh tls cert create -coordinator -name %s -hosts %s", c.Name, strings.Join(hosts, ","))
	}
	link, err := tlsutil.LoadCert(c.AgentLink.CertFile)
	if err == nil {
		if link.Subject.CommonName != c.Name {
			warns = append(warns, fmt.Sprintf("agent_link.cert_file %s is named %q but this coordinator is %q: the other members refuse it on the cluster link and on Raft",
				c.AgentLink.CertFile, link.Subject.CommonName, c.Name))
		}
		var want []string
		for _, a := range []struct{ key, listenKey, addr, listen string }{
			{"agent_link.advertise", "agent_link.listen", c.AgentLink.Advertise, c.AgentLink.Listen},
			{"raft.advertise", "raft.listen", c.Raft.Advertise, c.Raft.Listen},
		} {
			key, addr := a.key, a.addr
			if addr == "" {
				key, addr = a.listenKey, a.listen
			}
			host := hostOf(addr)
			if host == "" {
				if a.addr == "" && hostOf(a.listen) == "" {
					warns = append(warns, fmt.Sprintf("%s is %s and %s is empty: set %s to the address agents and the other members dial", a.listenKey, a.listen, a.key, a.key))
				}
				continue
			}
			if !slices.Contains(want, host) {
				want = append(want, host)
			}
			if err := tlsutil.CheckHost(link, host); err != nil {
				warns = append(warns, fmt.Sprintf("%s: agents and members dial %s (%s) but %v; they will fail with a certificate error until you %s",
					c.AgentLink.CertFile, addr, key, err, reissue(append(tlsutil.CertHosts(link), want...)...)))
			}
		}
	}
	httpHost := hostOf(c.HTTP.Listen)
	if c.HTTP.TLSCert == "" {
		if h, _, err := net.SplitHostPort(c.HTTP.Listen); err == nil && !isLoopback(h) {
			warns = append(warns, fmt.Sprintf("the API listens on %s without TLS: tokens cross the network in the clear; set http.tls_cert and http.tls_key (obmesh tls cert create -api -hosts HOST,...)", c.HTTP.Listen))
		}
	} else if api, err := tlsutil.LoadCert(c.HTTP.TLSCert); err == nil && httpHost != "" {
		if err := tlsutil.CheckHost(api, httpHost); err != nil {
			warns = append(warns, fmt.Sprintf("%s: clients dial the API at %s but %v; reissue it with: obmesh tls cert create -api -hosts %s",
				c.HTTP.TLSCert, c.HTTP.Listen, err, strings.Join(append(tlsutil.CertHosts(api), httpHost), ",")))
		}
	}
	return warns
}

// agentCertWarnings checks the agent's certificate against its id and
// sites: the coordinator refuses an agent whose certificate names another
// id or fewer sites than it claims.
func agentCertWarnings(c agent.Config) []string {
	cert, err := tlsutil.LoadCert(c.TLS.CertFile)
	if err != nil {
		return nil // the agent reports unreadable files itself
	}
	var warns []string
	fix := fmt.Sprintf("reissue it with: obmesh tls cert create -agent -name %s -sites %s", c.ID, strings.Join(c.Sites, ","))
	if cert.Subject.CommonName != c.ID {
		warns = append(warns, fmt.Sprintf("tls.cert_file %s is named %q but this agent's id is %q: coordinators refuse it; %s", c.TLS.CertFile, cert.Subject.CommonName, c.ID, fix))
	}
	have := tlsutil.CertSites(cert)
	var missing []string
	for _, s := range c.Sites {
		if !slices.Contains(have, s) {
			missing = append(missing, s)
		}
	}
	if len(missing) > 0 {
		warns = append(warns, fmt.Sprintf("tls.cert_file %s names sites %v but this agent serves %v too: coordinators refuse it; %s", c.TLS.CertFile, have, missing, fix))
	}
	return warns
}

// isLoopback reports whether host names this machine only.
func isLoopback(host string) bool {
	ip := net.ParseIP(host)
	return host == "localhost" || ip != nil && ip.IsLoopback()
}

func logWarnings(log *slog.Logger, warns []string) {
	for _, w := range warns {
		log.Warn(w)
	}
}
