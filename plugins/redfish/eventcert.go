package redfish

import (
	"encoding/pem"

	"github.com/stmcginnis/gofish"

	"github.com/obmesh/obmesh/plugins/sdk"
)

// pinCA asks the BMC to verify the destination's certificate against
// ca (PEM; spec.VerifyCA) for the subscription at uri, the Redfish way
// (EventDestination v1_9): each CA certificate is POSTed to the
// subscription's Certificates collection ({"CertificateString": PEM,
// "CertificateType": "PEM"}), then VerifyCertificate is PATCHed to true. A
// subscription already verifying (one adopted after a lost answer) is left
// as it is. A subscription that shows no VerifyCertificate or no
// Certificates link, or a BMC that refuses either step, keeps delivering
// without verifying, and quirk no_verify_certificate says so (and stops
// later creates from trying). A failed read of the subscription says
// nothing: the next create tries again.
func pinCA(client *gofish.APIClient, uri string, ca []byte, res *sdk.CreateResult) {
	if len(ca) == 0 || uri == "" || sdk.HasQuirk(res.Quirks, sdk.QuirkNoVerifyCertificate) {
		return
	}
	cannot := func() { res.Quirks = addQuirk(res.Quirks, sdk.QuirkNoVerifyCertificate) }
	doc, err := getObject(client, uri)
	if err != nil {
		return
	}
	verifying, hasVerify := field[bool](doc, "VerifyCertificate")
	certs := linkOf(doc, "Certificates")
	switch {
	case !hasVerify || certs == "":
		cannot()
		return
	case verifying:
		return
	}
	rest, n := ca, 0
	for {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		resp, err := client.Post(certs, map[string]any{
			"CertificateString": string(pem.EncodeToMemory(blk)), "CertificateType": "PEM"})
		if err != nil {
			cannot()
			return
		}
		resp.Body.Close()
		n++
	}
	if n == 0 {
		return // nothing usable was given
	}
	resp, err := client.Patch(uri, map[string]any{"VerifyCertificate": true})
	if err != nil {
		cannot()
		return
	}
	resp.Body.Close()
}
