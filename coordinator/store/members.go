package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/obmesh/obmesh/internal/tlsutil"
)

// Membership errors. The API maps them to client errors: a refused change
// changes nothing.
var (
	// ErrPeerUnreachable means a candidate member could not be reached at
	// its Raft address.
	ErrPeerUnreachable = errors.New("the candidate member cannot be reached at its Raft address")
	// ErrPeerIdentity means a candidate member did not prove over mutual
	// TLS that it is a coordinator of this group with the id being added.
	ErrPeerIdentity = errors.New("the candidate member is not the coordinator being added")
	// ErrLastVoter refuses removing the group's only voter.
	ErrLastVoter = errors.New("cannot remove the group's last voter")
)

// peerCheckTimeout bounds VerifyPeer when ctx allows longer.
const peerCheckTimeout = 5 * time.Second

// VerifyPeer reaches a (candidate) member at its Raft address over the
// Raft port's mutual TLS, as Raft itself will, and checks it presents a
// coordinator certificate of the group's CA valid for that address and
// named id. It does not change anything.
func (s *Store) VerifyPeer(ctx context.Context, id, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, peerCheckTimeout)
	defer cancel()
	conn, err := s.stream.dial(ctx, addr)
	if err != nil {
		var de *dialError
		if errors.As(err, &de) || ctx.Err() != nil {
			return fmt.Errorf("%w: %s: %v", ErrPeerUnreachable, addr, err)
		}
		return fmt.Errorf("%w: %s did not complete a mutual-TLS handshake as a coordinator of this group "+
			"(its certificate must come from the group's CA, have the coordinator role and list the host of %s): %v", ErrPeerIdentity, addr, addr, err)
	}
	defer conn.Close()
	_, name, err := tlsutil.PeerIdentity(conn.ConnectionState())
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrPeerIdentity, addr, err)
	}
	if name != id {
		return fmt.Errorf("%w: the coordinator at %s is %q, not %q (a member's id must be its certificate's name)", ErrPeerIdentity, addr, name, id)
	}
	return nil
}
