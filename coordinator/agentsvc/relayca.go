package agentsvc

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"

	"github.com/obmesh/obmesh/internal/agentpb"
)

// maxRelayCA bounds the CA an agent announces for its relay.
const maxRelayCA = 64 << 10

// relayCAOf is the relay CA a hello announces when it is usable: PEM
// certificates only, at most maxRelayCA bytes, with a relay URL. Anything
// else is ignored with a warning (the BMCs then deliver unverified); the
// agent is not refused for it.
func (s *Service) relayCAOf(hello *agentpb.Hello) []byte {
	b := hello.GetRelayCaPem()
	if len(b) == 0 {
		return nil
	}
	bad := func(why string) []byte {
		s.logger.Warn("agent's relay CA ignored", "agent", hello.AgentId, "reason", why)
		return nil
	}
	if hello.RelayUrl == "" {
		return bad("no relay URL")
	}
	if len(b) > maxRelayCA {
		return bad("too large")
	}
	rest, n := b, 0
	for {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			return bad("not a certificate: " + blk.Type)
		}
		if _, err := x509.ParseCertificate(blk.Bytes); err != nil {
			return bad("a certificate does not parse")
		}
		n++
	}
	if n == 0 || len(bytes.TrimSpace(rest)) != 0 {
		return bad("not PEM certificates")
	}
	return b
}
