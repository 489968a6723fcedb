package agentsvc

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/obmesh/obmesh/internal/agentpb"
)

// TestRelayCAOf: an announced relay CA is kept only when it is PEM
// certificates within the size limit from an agent with a relay; anything
// else is dropped (the agent is not refused for it).
func TestRelayCAOf(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "relay CA"},
		NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	s := &Service{logger: slog.New(slog.DiscardHandler)}
	const url = "https://10.0.0.5:8443"
	for _, tc := range []struct {
		name string
		url  string
		pem  []byte
		keep bool
	}{
		{"a CA", url, ca, true},
		{"two CAs", url, append(append([]byte{}, ca...), ca...), true},
		{"none", url, nil, false},
		{"no relay URL", "", ca, false},
		{"a private key", url, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1}}), false},
		{"garbage", url, []byte("not pem"), false},
		{"a broken certificate", url, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1, 2}}), false},
		{"trailing garbage", url, append(append([]byte{}, ca...), "junk"...), false},
		{"too large", url, append(append([]byte{}, ca...), strings.Repeat("\n", maxRelayCA)...), false},
	} {
		got := s.relayCAOf(&agentpb.Hello{AgentId: "a1", RelayUrl: tc.url, RelayCaPem: tc.pem})
		if (got != nil) != tc.keep {
			t.Errorf("%s: kept %v, want %v", tc.name, got != nil, tc.keep)
		}
	}
}
