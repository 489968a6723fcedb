package redfish_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/obmesh/obmesh/plugins/redfish"
	"github.com/obmesh/obmesh/plugins/sdk"
)

// TestLogin_BMCEchoingThePasswordDoesNotLeakIt: a BMC that quotes the
// submitted password in its error (Redfish MessageArgs echo bad values) does
// not get it into the driver's error: a long password is replaced, a short
// one withholds the BMC's answer, and the error is still ErrInvalid (400).
func TestLogin_BMCEchoingThePasswordDoesNotLeakIt(t *testing.T) {
	bmc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/redfish/v1/SessionService/Sessions" {
			http.NotFound(w, r)
			return
		}
		var login struct{ UserName, Password string }
		b, _ := io.ReadAll(r.Body)
		json.Unmarshal(b, &login)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		msg, _ := json.Marshal(fmt.Sprintf("The value %s for the property Password is of a different format than the property can accept.", login.Password))
		args, _ := json.Marshal([]string{login.Password, "Password"})
		fmt.Fprintf(w, `{"error":{"code":"Base.1.8.GeneralError","message":"bad request","@Message.ExtendedInfo":[{"MessageId":"Base.1.8.PropertyValueFormatError","Message":%s,"MessageArgs":%s}]}}`, msg, args)
	}))
	defer bmc.Close()
	for _, pw := range []string{"Correct-Horse-Battery", `pa"ss\word!`, "calvin", "d"} {
		n := sdk.Node{Name: "rf", Key: "rf@1", Address: bmc.URL, Username: "admin", Password: sdk.Secret(pw),
			Options: map[string]string{redfish.OptInsecure: "true"}}
		b, err := redfish.New().Open(t.Context(), n)
		if err == nil {
			_, err = b.(sdk.PowerGetter).PowerState(t.Context())
			b.Close()
		}
		if !errors.Is(err, sdk.ErrInvalid) {
			t.Errorf("pw %q: login refused with 400 = %v, want ErrInvalid", pw, err)
			continue
		}
		msg := err.Error()
		t.Logf("pw %q: %s", pw, msg)
		if len(pw) >= sdk.MinRedactLen && (strings.Contains(msg, pw) || strings.Contains(msg, `pa\"ss\\word`)) {
			t.Errorf("pw %q: the error quotes the password: %s", pw, msg)
		}
		if len(pw) < sdk.MinRedactLen && (strings.Contains(msg, "value "+pw+" ") || strings.Contains(msg, `"`+pw+`"`) || strings.Contains(msg, sdk.Redacted)) {
			t.Errorf("pw %q: the error reveals the short password: %s", pw, msg)
		}
		if !strings.Contains(msg, "400") {
			t.Errorf("pw %q: the error lost the BMC's status: %s", pw, msg)
		}
	}
}
