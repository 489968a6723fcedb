package config

import (
	"strings"
	"testing"
	"time"
)

func TestDecode_Strict(t *testing.T) {
	var c struct {
		Name    string   `toml:"name"`
		Timeout Duration `toml:"timeout"`
		Sub     struct {
			X int `toml:"x"`
		} `toml:"sub"`
	}
	if err := Decode("name = \"a\"\ntimeout = \"3s\"\n[sub]\nx = 1\n", &c); err != nil {
		t.Fatal(err)
	}
	if c.Timeout.D() != 3*time.Second || c.Sub.X != 1 {
		t.Errorf("decoded %+v", c)
	}
	err := Decode("nmae = \"a\"\n[sub]\ny = 2\n", &c)
	if err == nil || !strings.Contains(err.Error(), "nmae") || !strings.Contains(err.Error(), "sub.y") {
		t.Errorf("Decode(typos) = %v, want an error naming nmae and sub.y", err)
	}
	if err := Decode("timeout = \"soon\"\n", &c); err == nil {
		t.Errorf("Decode(bad duration) = nil")
	}
}
