//go:build !linux

package bmcsim

import "errors"

func listenShared() (sharedSocket, error) {
	return nil, errors.New("bmcsim: a shared fleet needs Linux (IP_PKTINFO on loopback); use StartIPMIFleet")
}
