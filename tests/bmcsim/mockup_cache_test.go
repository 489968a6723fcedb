package bmcsim

import (
	"testing"
)

// Every parse of the same bytes is a document of its own: changing one
// (a BMC's power, boot override, nested members) leaves the others and the
// cache as parsed.
func TestParseDoc_CopiesAreIndependent(t *testing.T) {
	b := []byte(`{"PowerState":"Off","Boot":{"BootSourceOverrideTarget":"None","Allowed":["Pxe","Hdd"]},"Members":[{"@odata.id":"/a"}],"Count":2,"Flag":true,"Null":null}`)
	first, err := parseDoc(b)
	if err != nil {
		t.Fatal(err)
	}
	first["PowerState"] = "On"
	first["Boot"].(map[string]any)["BootSourceOverrideTarget"] = "Pxe"
	first["Boot"].(map[string]any)["Allowed"].([]any)[0] = "Cd"
	first["Members"].([]any)[0].(map[string]any)["@odata.id"] = "/b"
	for range 2 {
		again, err := parseDoc(b)
		if err != nil {
			t.Fatal(err)
		}
		boot := again["Boot"].(map[string]any)
		if again["PowerState"] != "Off" || boot["BootSourceOverrideTarget"] != "None" || boot["Allowed"].([]any)[0] != "Pxe" ||
			again["Members"].([]any)[0].(map[string]any)["@odata.id"] != "/a" || again["Count"] != float64(2) || again["Flag"] != true {
			t.Fatalf("a later parse sees an earlier copy's changes: %v", again)
		}
		if v, ok := again["Null"]; !ok || v != nil {
			t.Errorf("null member lost: %v", again)
		}
		again["PowerState"] = "On" // must not reach the next copy either
	}
	if _, err := parseDoc([]byte(`{not json`)); err == nil {
		t.Error("invalid JSON parsed")
	}
}
