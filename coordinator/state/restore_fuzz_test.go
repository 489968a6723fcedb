package state

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"testing"
)

// restoreSeeds are restore payloads: the probes from the security review,
// each way a record can be bad, and valid documents (a saved state, the
// smallest restore).
func restoreSeeds(t testing.TB) [][]byte {
	seeds := [][]byte{
		[]byte(`{"v":1,"nodes":[null]}`),
		[]byte(`{"v":1,"nodes":[{"name":"../../etc","driver":"","site":"bad site!"}]}`),
		[]byte(`{"v":1,"nodes":[{"name":"a\u202eb","driver":"mock","site":"s"}]}`),
		[]byte(`{"v":1,"nodes":[{"name":"a","driver":"mock","site":"s"},{"name":"a","driver":"mock","site":"s"}]}`),
		[]byte(`{"v":1,"nodes":[{"name":"a","driver":"mock","site":"s","address":"\u001b]0;x\u0007"}]}`),
		[]byte(`{"v":1,"nodes":[{"name":"a","driver":"mock","site":"s","token":{"salt":"","hash":""}}]}`),
		[]byte(`{"v":1,"nodes":[{"name":"a","driver":"mock","site":"s","credential":{"key_id":"k","nonce":"","ciphertext":"eA=="}}]}`),
		[]byte(`{"v":1,"nodes":[{"name":"a","driver":"mock","site":"s","options":{"":"x"}}]}`),
		[]byte(`{"v":1,"sites":[null],"agents":[null],"members":[null]}`),
		[]byte(`{"v":1,"agents":[{"id":"a","sites":["s","s","t"],"drivers":[{"name":"mock","version":"1"}]}]}`),
		[]byte(`{"v":1,"audit":[{"id":"x","receipt":{}},{"id":"x","receipt":{}}]}`),
		[]byte(`{"v":1,"subscriptions":[null]}`),
		[]byte(`{"v":1,"bmc_subscriptions":[null]}`),
		[]byte(`{"v":1}`),
		[]byte(`{"v":0}`),
		[]byte(`null`),
		[]byte(`{}`),
		[]byte(`[]`),
		[]byte(`"x"`),
	}
	s := New()
	applyAll(t, s, randomLog(rand.New(rand.NewPCG(3, 3)), 60))
	return append(seeds, snap(t, s))
}

// FuzzRestore proposes random snapshot documents as RestoreState and applies
// each on two replicas: never a panic or a fatal error, both replicas end
// identical, a refused restore is a no-op with ErrInvalid (and is exactly
// what CheckSnapshot, the API's pre-check, refuses), and an accepted one
// leaves a state whose every record is valid and that survives snapshot
// and restore unchanged.
func FuzzRestore(f *testing.F) {
	for _, s := range restoreSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		if !json.Valid(doc) {
			// The API refuses non-JSON before anything else, and a
			// RestoreState cannot even be encoded around it.
			if _, err := Encode(RestoreState{Snapshot: doc}); err == nil {
				t.Fatalf("a RestoreState around invalid JSON was encoded")
			}
			return
		}
		entry, err := Encode(RestoreState{Snapshot: doc})
		if err != nil {
			t.Fatalf("Encode(RestoreState) = %v", err)
		}
		base := baseLog(t)
		idx := uint64(len(base) + 1)
		var results [2]Result
		var replicas [2]*State
		for i := range replicas {
			s := replica(t)
			res, fatal := s.Apply(idx, entry)
			if fatal != nil {
				t.Fatalf("replica %d: fatal error %v for a decodable restore", i, fatal)
			}
			results[i], replicas[i] = res, s
			checkInvariants(t, s)
		}
		a, b := snap(t, replicas[0]), snap(t, replicas[1])
		if !bytes.Equal(a, b) {
			t.Fatalf("replicas differ after the same restore")
		}
		if (results[0].Err == nil) != (results[1].Err == nil) {
			t.Fatalf("replicas disagree: %v / %v", results[0].Err, results[1].Err)
		}
		pre := CheckSnapshot(doc)
		if (pre == nil) != (results[0].Err == nil) {
			t.Fatalf("CheckSnapshot = %v but apply = %v: the API check and the state machine disagree", pre, results[0].Err)
		}
		if results[0].Err != nil {
			if !errors.Is(results[0].Err, ErrInvalid) {
				t.Fatalf("refused restore error %v does not wrap ErrInvalid", results[0].Err)
			}
			ref := replica(t)
			ref.Apply(idx, encode(t, DeleteNode{Name: "no-such-node"}))
			if want := snap(t, ref); !bytes.Equal(a, want) {
				t.Fatalf("a refused restore changed the state:\n got %s\nwant %s", a, want)
			}
			return
		}
		c := New()
		if err := c.Restore(bytes.NewReader(a)); err != nil {
			t.Fatalf("the restored state's own snapshot does not restore: %v", err)
		}
		if got := snap(t, c); !bytes.Equal(got, a) {
			t.Fatalf("snapshot → restore → snapshot differs after a restore command")
		}
	})
}
