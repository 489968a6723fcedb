package ops

import "testing"

func TestPowerInFlight(t *testing.T) {
	r := &Runner{reserved: map[string]string{}}
	r.reserved["a"] = tag("n1", ActPowerStatus)
	r.reserved["b"] = tag("n10", ActPowerOff)
	r.reserved["c"] = tag("n2", ActBootGet)
	if r.PowerInFlight("n1") {
		t.Fatal("a status read counted as a power change in flight (or n10's action as n1's)")
	}
	if r.PowerInFlight("n2") {
		t.Fatal("a boot read counted as a power change in flight")
	}
	r.reserved["d"] = tag("n1", ActPowerCycle)
	if !r.PowerInFlight("n1") || !r.PowerInFlight("n10") {
		t.Fatal("a running power action not seen")
	}
}
