package state

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// TestRegisterAgent_RelayEndpoint: an agent's announced relay URL and
// fingerprint are stored, replaced on every connect (an agent restarted
// without a relay clears them), carried by snapshots, and bounded.
func TestRegisterAgent_RelayEndpoint(t *testing.T) {
	s := New()
	reg := func(idx uint64, a Agent) Result {
		t.Helper()
		r, err := s.Apply(idx, encode(t, RegisterAgent{Agent: a, StampUnixNano: int64(idx)}))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	agent := func(id string) Agent {
		for _, a := range s.Agents() {
			if a.ID == id {
				return a
			}
		}
		t.Fatalf("agent %s not stored", id)
		return Agent{}
	}
	const url, fp = "https://10.0.0.5:8443", "AB:CD:EF"
	if r := reg(1, Agent{ID: "a1", Sites: []string{"s1"}, RelayURL: url, RelayFingerprint: fp}); r.Err != nil {
		t.Fatal(r.Err)
	}
	if a := agent("a1"); a.RelayURL != url || a.RelayFingerprint != fp {
		t.Fatalf("stored relay %q %q, want %q %q", a.RelayURL, a.RelayFingerprint, url, fp)
	}

	var snap bytes.Buffer
	if err := s.Snapshot(&snap); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(snap.String(), `"relay_url":"`+url+`"`) {
		t.Errorf("snapshot does not carry the relay URL: %s", snap.String())
	}
	restored := New()
	if err := restored.Restore(bytes.NewReader(snap.Bytes())); err != nil {
		t.Fatal(err)
	}
	if as := restored.Agents(); len(as) != 1 || as[0].RelayURL != url || as[0].RelayFingerprint != fp {
		t.Fatalf("restored agents = %+v", as)
	}

	// Reconnecting without a relay clears it.
	if r := reg(2, Agent{ID: "a1", Sites: []string{"s1"}}); r.Err != nil {
		t.Fatal(r.Err)
	}
	if a := agent("a1"); a.RelayURL != "" || a.RelayFingerprint != "" || a.Connects != 2 {
		t.Fatalf("after a connect without a relay: %+v", a)
	}

	// An oversized or unprintable announcement is refused and changes
	// nothing.
	for _, bad := range []Agent{
		{ID: "a1", Sites: []string{"s1"}, RelayURL: "https://x/" + strings.Repeat("a", 300)},
		{ID: "a1", Sites: []string{"s1"}, RelayURL: "https://x/\x00"},
		{ID: "a1", Sites: []string{"s1"}, RelayURL: url, RelayFingerprint: strings.Repeat("F", 200)},
	} {
		if r := reg(3, bad); !errors.Is(r.Err, ErrInvalid) {
			t.Errorf("RegisterAgent(%.40q) = %v, want ErrInvalid", bad.RelayURL, r.Err)
		}
	}
	if a := agent("a1"); a.Connects != 2 || a.RelayURL != "" {
		t.Errorf("a refused announcement changed the agent: %+v", a)
	}
}
