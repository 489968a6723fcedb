package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"

	"github.com/obmesh/obmesh/hilproxy"
)

// Config is obmd's configuration, from either style.
type Config struct {
	ListenAddr string
	AdminToken string
	DBType     string
	DBPath     string
	Insecure   bool
	TLSCert    string
	TLSKey     string
}

// LoadFile reads the -config JSON file of obmd v0.1/v0.2. The file must
// not be accessible to group or others. Without TLS settings it serves
// plain HTTP on any address, as v0.1 did (HIL's test fixture relies on it).
func LoadFile(path string) (Config, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return Config{}, err
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return Config{}, fmt.Errorf("permissions on %q are too permissive", path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, err
	}
	var c Config
	if err := json.Unmarshal(b, &c); err != nil {
		return Config{}, fmt.Errorf("parsing config file %q: %v", path, err)
	}
	if _, err := hilproxy.ParseToken(c.AdminToken); err != nil {
		return Config{}, errors.New("Invalid admin token.")
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return Config{}, errors.New("TLSCert and TLSKey must be specified together.")
	}
	if c.Insecure && c.TLSCert != "" {
		return Config{}, errors.New("Insecure is set, but so are TLS certificates; pick one.")
	}
	return c, c.check()
}

// FromEnv reads the environment variables of obmd's last release, with its
// rule that plaintext HTTP is allowed only on a loopback IP unless
// INSECURE=true.
func FromEnv(getenv func(string) string) (Config, error) {
	const prefix = "Parsing config from environment: "
	c := Config{
		DBType: getenv("DB_TYPE"), DBPath: getenv("DB_PATH"), AdminToken: getenv("ADMIN_TOKEN"),
		ListenAddr: getenv("LISTEN_ADDR"), TLSCert: getenv("TLS_CERT"), TLSKey: getenv("TLS_KEY"),
	}
	for _, req := range []struct{ name, val string }{{"DB_TYPE", c.DBType}, {"DB_PATH", c.DBPath}, {"ADMIN_TOKEN", c.AdminToken}, {"LISTEN_ADDR", c.ListenAddr}} {
		if req.val == "" {
			return Config{}, fmt.Errorf(prefix+"required environment variable %q is not set.", req.name)
		}
	}
	if v := getenv("INSECURE"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return Config{}, fmt.Errorf(prefix+"INSECURE must be true or false, not %q.", v)
		}
		c.Insecure = b
	}
	if _, err := hilproxy.ParseToken(c.AdminToken); err != nil {
		return Config{}, errors.New(prefix + "Invalid token.")
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return Config{}, errors.New("TLS_CERT and TLS_KEY must be specified together.")
	}
	if c.TLSCert == "" && !c.Insecure {
		host, _, err := net.SplitHostPort(c.ListenAddr)
		if err != nil {
			return Config{}, fmt.Errorf(prefix+"LISTEN_ADDR: %v", err)
		}
		if host != "127.0.0.1" && host != "::1" {
			msg := "Your configuration says to listen on a non-loopback address, using plaintext HTTP. " +
				"This is a bad idea. Either set TLS_CERT and TLS_KEY, listen on 127.0.0.1 or ::1, " +
				"or, if you really want to do this, set the INSECURE environment variable to true."
			if host == "localhost" {
				msg += " (Note: \"localhost\" is not recognized as loopback; use 127.0.0.1 or ::1.)"
			}
			return Config{}, errors.New(msg)
		}
	}
	return c, c.check()
}

// check covers what both styles share.
func (c Config) check() error {
	if _, _, err := net.SplitHostPort(c.ListenAddr); err != nil {
		return fmt.Errorf("listen address %q: %v", c.ListenAddr, err)
	}
	switch c.DBType {
	case "sqlite3":
	case "postgres":
		return errors.New("this obmd (obmesh) keeps its state in Raft and imports SQLite databases only; " +
			"copy the nodes table to SQLite, or register the nodes with `obmesh import obmd`")
	default:
		return fmt.Errorf("unknown database type %q (want sqlite3)", c.DBType)
	}
	if c.DBPath == "" {
		return errors.New("DBPath is empty")
	}
	return nil
}
