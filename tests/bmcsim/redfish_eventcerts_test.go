package bmcsim

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/obmesh/obmesh/plugins/redfish"
	"github.com/obmesh/obmesh/plugins/sdk"
)

// certAuthority is a throw-away CA for a destination's certificate.
type certAuthority struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newCertAuthority(t *testing.T, serial int64) *certAuthority {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "destination CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return &certAuthority{cert: c, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// leaf issues a server certificate for 127.0.0.1.
func (ca *certAuthority) leaf(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "relay"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// ctxReceiver is an https destination serving a certificate of ca; it
// records the Context of every event document it accepts.
type ctxReceiver struct {
	srv      *httptest.Server
	mu       sync.Mutex
	contexts []string
}

func newCtxReceiver(t *testing.T, ca *certAuthority) *ctxReceiver {
	t.Helper()
	rc := &ctxReceiver{}
	rc.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var ev map[string]any
		json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&ev)
		c, _ := ev["Context"].(string)
		rc.mu.Lock()
		rc.contexts = append(rc.contexts, c)
		rc.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	rc.srv.TLS = &tls.Config{Certificates: []tls.Certificate{ca.leaf(t)}}
	rc.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // refused handshakes are expected
	rc.srv.StartTLS()
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *ctxReceiver) got(c string) int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	n := 0
	for _, x := range rc.contexts {
		if x == c {
			n++
		}
	}
	return n
}

func simSub(r *Redfish, uri string) SimSubscription {
	for _, s := range r.EventSubscriptions() {
		if s.URI == uri {
			return s
		}
	}
	return SimSubscription{}
}

// TestRedfishEvents_VerifyCertificate (spec case 29, the BMC side): through
// the redfish driver, in process and as a plugin process, a subscription
// made with a CA gets it uploaded to its Certificates collection and
// VerifyCertificate set; the simulated BMC then delivers to a destination
// whose certificate that CA signed, and refuses (at the handshake, retrying)
// one pinned to another CA. A BMC without VerifyCertificate gets the
// subscription anyway, delivers unverified, and the driver reports quirk
// no_verify_certificate.
func TestRedfishEvents_VerifyCertificate(t *testing.T) {
	drivers := map[string]func(t *testing.T) sdk.Driver{
		"in-process": func(*testing.T) sdk.Driver { return redfish.New() },
		"plugin-process": func(t *testing.T) sdk.Driver {
			p, err := sdk.Start(sdkSelf(), sdk.StartOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(p.Kill)
			return p.Driver
		},
	}
	for name, mk := range drivers {
		t.Run(name, func(t *testing.T) {
			right, wrong := newCertAuthority(t, 1), newCertAuthority(t, 2)
			rc := newCtxReceiver(t, right)
			r := startEvents(t, RedfishEvents{VerifyCertificate: true, DefaultRetryPolicy: PolicyRetryForever, RetryInterval: 50 * time.Millisecond})
			ev := openRF(t, mk(t), r).(sdk.EventSubscriber)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()

			good, err := ev.Subscribe(ctx, sdk.SubscriptionSpec{Destination: rc.srv.URL + "/a", Context: "pinned-right", VerifyCA: right.pem})
			if err != nil || sdk.HasQuirk(good.Quirks, sdk.QuirkNoVerifyCertificate) {
				t.Fatalf("subscribe with the right CA: %+v, %v", good, err)
			}
			bad, err := ev.Subscribe(ctx, sdk.SubscriptionSpec{Destination: rc.srv.URL + "/b", Context: "pinned-wrong", VerifyCA: wrong.pem})
			if err != nil {
				t.Fatalf("subscribe with the wrong CA: %v", err)
			}
			g := simSub(r, good.Subscription.URI)
			if !g.VerifyCertificate || len(g.CACerts) != 1 || g.CACerts[0] != string(right.pem) {
				t.Fatalf("the BMC holds VerifyCertificate=%v with %d CA(s); want true with the CA given", g.VerifyCertificate, len(g.CACerts))
			}

			r.PushEvent(RedfishEvent{MessageID: "ResourceEvent.1.4.ResourceChanged"})
			eventually(t, "delivery to the destination the pinned CA signed", func() bool { return rc.got("pinned-right") == 1 })
			eventually(t, "failed attempts toward the destination another CA signed", func() bool {
				return simSub(r, bad.Subscription.URI).Attempts >= 3
			})
			if n := rc.got("pinned-wrong"); n != 0 {
				t.Errorf("the subscription pinned to another CA delivered %d event(s)", n)
			}
			if s := simSub(r, bad.Subscription.URI); s.Delivered != 0 || !s.VerifyCertificate {
				t.Errorf("wrong-CA subscription: %+v", s)
			}
		})
	}
}

// TestRedfishEvents_VerifyCertificateUnsupported: without VerifyCertificate
// on the BMC the subscription is made, delivers unverified, and the quirk
// says the BMC cannot verify; a known quirk skips the attempt.
func TestRedfishEvents_VerifyCertificateUnsupported(t *testing.T) {
	ca := newCertAuthority(t, 3)
	rc := newCtxReceiver(t, ca)
	r := startEvents(t, RedfishEvents{})
	ev := openRF(t, redfish.New(), r).(sdk.EventSubscriber)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := ev.Subscribe(ctx, sdk.SubscriptionSpec{Destination: rc.srv.URL + "/a", Context: "unverified", VerifyCA: ca.pem})
	if err != nil || !sdk.HasQuirk(res.Quirks, sdk.QuirkNoVerifyCertificate) {
		t.Fatalf("subscribe: %+v, %v; want it made with quirk %s", res, err, sdk.QuirkNoVerifyCertificate)
	}
	r.PushEvent(RedfishEvent{MessageID: "ResourceEvent.1.4.ResourceChanged"})
	eventually(t, "unverified delivery", func() bool { return rc.got("unverified") == 1 })

	// No CA asked for: no quirk.
	res, err = ev.Subscribe(ctx, sdk.SubscriptionSpec{Destination: rc.srv.URL + "/b", Context: "plain"})
	if err != nil || sdk.HasQuirk(res.Quirks, sdk.QuirkNoVerifyCertificate) {
		t.Fatalf("subscribe without a CA: %+v, %v", res, err)
	}
}

// TestRedfishEvents_SubscriptionCertificatesAPI: the Certificates collection
// as a client sees it: advertised on the subscription, a PEM certificate
// added and listed, anything else refused, VerifyCertificate PATCHable;
// none of it on a BMC without the option.
func TestRedfishEvents_SubscriptionCertificatesAPI(t *testing.T) {
	ca := newCertAuthority(t, 4)
	rc := newCtxReceiver(t, ca)
	r := startEvents(t, RedfishEvents{VerifyCertificate: true})
	a := call(t, r, "POST", subsPath, subBody(rc.srv.URL, nil))
	if a.status != 201 {
		t.Fatal(a.status)
	}
	uri := a.header.Get("Location")
	doc := call(t, r, "GET", uri, nil).doc
	link, _ := doc["Certificates"].(map[string]any)
	if doc["VerifyCertificate"] != false || link["@odata.id"] != uri+certsSuffix {
		t.Fatalf("subscription shows VerifyCertificate %v, Certificates %v", doc["VerifyCertificate"], doc["Certificates"])
	}
	coll := uri + certsSuffix
	for _, body := range []map[string]any{
		{"CertificateString": "not a certificate", "CertificateType": "PEM"},
		{"CertificateString": string(ca.pem), "CertificateType": "PKCS7"},
	} {
		if a := call(t, r, "POST", coll, body); a.status != 400 {
			t.Errorf("POST %v = %d, want 400", body["CertificateType"], a.status)
		}
	}
	a = call(t, r, "POST", coll, map[string]any{"CertificateString": string(ca.pem), "CertificateType": "PEM"})
	if a.status != 201 || a.header.Get("Location") != coll+"/1" {
		t.Fatalf("POST certificate = %d at %q", a.status, a.header.Get("Location"))
	}
	if m := call(t, r, "GET", coll, nil).doc["Members"].([]any); len(m) != 1 {
		t.Errorf("collection members %v", m)
	}
	if got := call(t, r, "GET", coll+"/1", nil).doc["CertificateString"]; !strings.Contains(got.(string), "BEGIN CERTIFICATE") {
		t.Errorf("certificate document %v", got)
	}
	if a := call(t, r, "PATCH", uri, map[string]any{"VerifyCertificate": true}); a.status != 204 {
		t.Errorf("PATCH VerifyCertificate = %d", a.status)
	}
	if s := simSub(r, uri); !s.VerifyCertificate || !slices.Equal(s.CACerts, []string{string(ca.pem)}) {
		t.Errorf("simulator holds %+v", s)
	}
	if a := call(t, r, "DELETE", coll+"/1", nil); a.status != 204 || len(simSub(r, uri).CACerts) != 0 {
		t.Errorf("DELETE certificate = %d", a.status)
	}

	plain := startEvents(t, RedfishEvents{})
	a = call(t, plain, "POST", subsPath, subBody(rc.srv.URL, nil))
	uri = a.header.Get("Location")
	doc = call(t, plain, "GET", uri, nil).doc
	if _, ok := doc["VerifyCertificate"]; ok || doc["Certificates"] != nil {
		t.Errorf("a BMC without the option shows %v / %v", doc["VerifyCertificate"], doc["Certificates"])
	}
	if a := call(t, plain, "PATCH", uri, map[string]any{"VerifyCertificate": true}); a.status != 400 {
		t.Errorf("PATCH VerifyCertificate on a BMC without it = %d, want 400", a.status)
	}
}
