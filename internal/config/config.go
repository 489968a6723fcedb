// Package config loads TOML configuration strictly: a key the target struct
// does not have is an error naming the key, so a typo never silently falls
// back to a default.
package config

import (
	"fmt"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// Load decodes the TOML file at path into v (a pointer to a struct that
// already holds the defaults).
func Load(path string, v any) error {
	md, err := toml.DecodeFile(path, v)
	if err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	return undecoded(path, md)
}

// Decode is Load for TOML text.
func Decode(text string, v any) error {
	md, err := toml.Decode(text, v)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	return undecoded("(text)", md)
}

func undecoded(path string, md toml.MetaData) error {
	if keys := md.Undecoded(); len(keys) > 0 {
		names := make([]string, len(keys))
		for i, k := range keys {
			names[i] = k.String()
		}
		return fmt.Errorf("config %s: unknown key(s): %s", path, strings.Join(names, ", "))
	}
	return nil
}

// Duration is a time.Duration written as "30s" in TOML.
type Duration time.Duration

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(b []byte) error {
	x, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("bad duration %q (want e.g. \"30s\")", b)
	}
	*d = Duration(x)
	return nil
}

// MarshalText implements encoding.TextMarshaler.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// D returns the time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }
