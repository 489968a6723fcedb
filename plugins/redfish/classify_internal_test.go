package redfish

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stmcginnis/gofish/common"

	"github.com/obmesh/obmesh/plugins/sdk"
)

// answer builds a BMC error answer as gofish reports it.
func answer(code int, ids ...string) error {
	var infos []string
	for _, id := range ids {
		infos = append(infos, fmt.Sprintf(`{"MessageId":%q,"Message":"m"}`, id))
	}
	body := fmt.Sprintf(`{"error":{"code":"Base.1.8.GeneralError","message":"g","@Message.ExtendedInfo":[%s]}}`, strings.Join(infos, ","))
	return common.ConstructError(code, []byte(body))
}

// Classes come from the MessageIds where they say something, else the
// status, also inside gofish's collection errors.
func TestClassify_StatusAndMessageIDs(t *testing.T) {
	coll := common.NewCollectionError()
	coll.Failures["/redfish/v1/Systems/1"] = answer(500)
	coll.Failures["/redfish/v1/Systems/2"] = answer(401)
	wrapped := fmt.Errorf("find the system: %w", coll)
	for _, c := range []struct {
		err  error
		want sdk.Class
	}{
		{answer(401), sdk.ClassAuth},
		{answer(500, "Base.1.8.NoValidSession"), sdk.ClassAuth},
		{answer(403, "Base.1.8.PasswordChangeRequired"), sdk.ClassAuth},
		{answer(403), sdk.ClassPrivilege},
		{answer(400, "Base.1.8.InsufficientPrivilege"), sdk.ClassPrivilege},
		{answer(400, "Base.1.8.ActionParameterValueNotInList"), sdk.ClassInvalid},
		{answer(400, "Base.1.8.ActionNotSupported"), sdk.ClassUnsupported},
		{answer(409), sdk.ClassBusy},
		{answer(500, "Base.1.8.ServiceTemporarilyUnavailable"), sdk.ClassBusy},
		{answer(503), sdk.ClassBusy},
		{answer(404), sdk.ClassUnsupported},
		{answer(500), sdk.ClassProtocol},
		{coll, sdk.ClassAuth},
		{wrapped, sdk.ClassAuth},
		{errors.New("dial tcp: connection refused"), sdk.ClassUnreachable},
	} {
		got := classify(context.Background(), "x", c.err)
		if sdk.ClassOf(got) != c.want {
			t.Errorf("%v: class %s, want %s", c.err, sdk.ClassOf(got), c.want)
		}
	}
	if got := classify(context.Background(), "power on", answer(400, "Base.1.8.ActionParameterValueNotInList")); !strings.Contains(got.Error(), "400 Base.1.8.ActionParameterValueNotInList") {
		t.Errorf("message %q does not name the status and MessageId", got)
	}
}

// The mapping table, with and without allowed types.
func TestPlan_Mapping(t *testing.T) {
	ra := func(allowed ...string) resetAction { return resetAction{target: "/t", allowed: allowed} }
	for _, c := range []struct {
		a     sdk.PowerAction
		cur   sdk.PowerState
		ra    resetAction
		sends []string
		class sdk.Class
	}{
		{sdk.PowerReset, sdk.StateOn, resetAction{target: "/t"}, []string{"ForceRestart"}, ""},
		{sdk.PowerCycle, sdk.StateOn, resetAction{target: "/t"}, []string{"ForceOff", "On"}, ""},
		{sdk.PowerCycle, sdk.StateOn, ra("On", "ForceOff", "PowerCycle"), []string{"PowerCycle"}, ""},
		{sdk.PowerCycle, sdk.StateOn, ra("ForceRestart"), []string{"ForceRestart"}, ""},
		{sdk.PowerReset, sdk.StateOn, ra("On", "ForceOff", "PowerCycle"), []string{"PowerCycle"}, ""},
		{sdk.PowerReset, sdk.StateOn, ra("On", "ForceOff"), []string{"ForceOff", "On"}, ""},
		{sdk.PowerReset, sdk.StateOn, ra("Nmi"), nil, sdk.ClassUnsupported},
		{sdk.PowerReset, sdk.StateOff, ra("On", "ForceRestart"), []string{"On"}, ""},
		{sdk.PowerOn, sdk.StateOff, ra("ForceOn"), []string{"ForceOn"}, ""},
		{sdk.PowerOn, sdk.StateOff, ra("PushPowerButton"), []string{"PushPowerButton"}, ""},
		{sdk.PowerOn, sdk.StateOn, ra("On"), nil, ""},
		{sdk.PowerSoftOff, sdk.StateOn, ra("On", "ForceOff"), nil, sdk.ClassUnsupported},
		{sdk.PowerSoftOff, sdk.StateOn, ra("GracefulShutdown"), []string{"GracefulShutdown"}, ""},
		{sdk.PowerOff, sdk.StateOff, ra("ForceOff"), nil, ""},
	} {
		steps, detail, err := plan(c.a, c.cur, c.ra)
		var sends []string
		for _, s := range steps {
			sends = append(sends, s.reset)
		}
		if sdk.ClassOf(err) != c.class || strings.Join(sends, ",") != strings.Join(c.sends, ",") || (err == nil && detail == "") {
			t.Errorf("%s from %s allowing %v: sends %v (%q), %v; want %v, class %q", c.a, c.cur, c.ra.allowed, sends, detail, err, c.sends, c.class)
		}
	}
}
