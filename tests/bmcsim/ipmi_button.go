package bmcsim

import "context"

// PressPower sets the chassis power as its front-panel button (or another
// management tool) would: behind the back of whatever manages the BMC. It
// is recorded in Ops like any power change the BMC carries out.
func (s *IPMI) PressPower(on bool) error {
	return s.hal.Chassis().SetPower(context.Background(), on)
}
