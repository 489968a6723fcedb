package sdk

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// reportingBMC is a PowerReporter whose report and error the test sets.
type reportingBMC struct {
	closer
	rep PowerReport
	err error
}

func (b *reportingBMC) SetPower(ctx context.Context, a PowerAction) error {
	_, err := b.SetPowerReport(ctx, a)
	return err
}

func (b *reportingBMC) SetPowerReport(context.Context, PowerAction) (PowerReport, error) {
	return b.rep, b.err
}

// plainSetter is a PowerSetter without a report.
type plainSetter struct{ closer }

func (plainSetter) SetPower(context.Context, PowerAction) error { return nil }

func TestPowerReport_CrossesTheBoundary(t *testing.T) {
	at := time.Unix(1700000000, 123456789)
	rep := PowerReport{Detail: "reset → PowerCycle (ForceRestart is not allowed)",
		Observed: []PowerObservation{{State: StateOn, At: at}, {State: StateOff, At: at.Add(time.Second)}, {State: StateOn, At: at.Add(3 * time.Second)}}}
	f := &reportingBMC{rep: rep}
	d, _ := wire(t, fakeDriver{f})
	b, err := d.Open(t.Context(), Node{Name: "n", Password: "pw-Secret-1234567"})
	if err != nil {
		t.Fatal(err)
	}
	r := b.(PowerReporter)
	got, err := r.SetPowerReport(t.Context(), PowerReset)
	if err != nil || !sameReport(got, rep) {
		t.Fatalf("report = %+v, %v; want %+v", got, err, rep)
	}

	// A failed action brings its report along (the outcome is unknown:
	// what was seen matters most then), and its class.
	f.err = Errorf(ClassOutcomeUnknown, "sent ForceRestart; observed on until the deadline")
	got, err = r.SetPowerReport(t.Context(), PowerReset)
	if !errors.Is(err, ErrOutcomeUnknown) || !strings.Contains(err.Error(), "observed on") || !sameReport(got, rep) {
		t.Fatalf("failed action: report %+v, err %v", got, err)
	}

	// The detail is the driver's, but a password in it is still kept out.
	f.err, f.rep = nil, PowerReport{Detail: "logged in with pw-Secret-1234567"}
	got, _ = r.SetPowerReport(t.Context(), PowerOn)
	if strings.Contains(got.Detail, "pw-Secret-1234567") {
		t.Errorf("detail shows the password: %q", got.Detail)
	}

	// A driver that does not report still works through SetPowerReport.
	d2, _ := wire(t, fakeDriver{plainSetter{}})
	b2, err := d2.Open(t.Context(), Node{Name: "n"})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := b2.(PowerReporter).SetPowerReport(t.Context(), PowerOn); err != nil || got.Detail != "" || len(got.Observed) != 0 {
		t.Errorf("plain setter: %+v, %v", got, err)
	}
}

func sameReport(a, b PowerReport) bool {
	if a.Detail != b.Detail || len(a.Observed) != len(b.Observed) {
		return false
	}
	for i := range a.Observed {
		if a.Observed[i].State != b.Observed[i].State || !a.Observed[i].At.Equal(b.Observed[i].At) {
			return false
		}
	}
	return true
}

// validatingDriver refuses every node whose option "bad" is set.
type validatingDriver struct{ fakeDriver }

func (validatingDriver) ValidateOptions(n Node) error {
	if v, ok := n.Options["bad"]; ok {
		return Errorf(ClassInvalid, "option bad=%s is refused (password %s)", v, n.Password.Reveal())
	}
	return nil
}

func TestValidateOptions_CrossesTheBoundary(t *testing.T) {
	d, _ := wire(t, validatingDriver{})
	v, ok := d.(OptionValidator)
	if !ok {
		t.Fatal("the host's driver is not an OptionValidator")
	}
	if err := v.ValidateOptions(Node{Name: "n", Options: map[string]string{"good": "1"}}); err != nil {
		t.Errorf("valid node: %v", err)
	}
	err := v.ValidateOptions(Node{Name: "n", Password: "pw-Secret-1234567", Options: map[string]string{"bad": "x"}})
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "bad=x") || strings.Contains(err.Error(), "pw-Secret-1234567") {
		t.Errorf("invalid node: %v (want ErrInvalid naming the option, no password)", err)
	}
	// A driver without checks: unsupported, so a host knows nothing was
	// checked.
	d2, _ := wire(t, fakeDriver{closer{}})
	if err := d2.(OptionValidator).ValidateOptions(Node{Name: "n"}); !errors.Is(err, ErrUnsupported) {
		t.Errorf("driver without checks: %v, want ErrUnsupported", err)
	}
}
