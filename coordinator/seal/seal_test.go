package seal

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestKeyring_SealOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keyring.json")
	if err := Create(path); err != nil {
		t.Fatal(err)
	}
	if err := Create(path); err == nil {
		t.Errorf("Create over an existing keyring = nil, want an error")
	}
	k, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	s := k.Seal([]byte("hunter2-canary"), "node1")
	if s.KeyID != k.PrimaryID() || bytes.Contains(s.Ciphertext, []byte("hunter2")) {
		t.Fatalf("Seal = %+v", s)
	}
	got, err := k.Open(s, "node1")
	if err != nil || string(got) != "hunter2-canary" {
		t.Fatalf("Open = %q, %v", got, err)
	}
	if _, err := k.Open(s, "node2"); !errors.Is(err, ErrOpen) {
		t.Errorf("Open for another owner = %v, want ErrOpen", err)
	}
	s.Ciphertext[0] ^= 1
	if _, err := k.Open(s, "node1"); !errors.Is(err, ErrOpen) {
		t.Errorf("Open tampered = %v, want ErrOpen", err)
	}
	s.KeyID = "other"
	if _, err := k.Open(s, "node1"); !errors.Is(err, ErrOpen) {
		t.Errorf("Open unknown key = %v, want ErrOpen", err)
	}
}

func TestLoad_RefusesWorldReadable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keyring.json")
	if err := Create(path); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err != nil {
		t.Fatalf("Load(0600 keyring) = %v", err) // the refusal below is the mode's
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err == nil {
		t.Errorf("Load(0644 keyring) = nil, want an error")
	}
}

func TestLoad_Bad(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{
		"notjson":   "x",
		"shortkey":  `{"primary":"a","keys":{"a":"AAAA"}}`,
		"noprimary": `{"primary":"b","keys":{"a":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}}`,
	} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Load(p); err == nil {
			t.Errorf("Load(%s) = nil, want an error", name)
		}
	}
}
