package bmcsim

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// A subscription's Certificates collection (RedfishEvents.VerifyCertificate):
// the CA certificates its deliveries verify the destination against once
// VerifyCertificate is set.

const certsSuffix = "/Certificates"

type subCert struct {
	id  string
	pem string
}

// certPEMs lists the certificates of s. Callers hold mu.
func (s *rfSub) certPEMs() []string {
	var out []string
	for _, c := range s.certs {
		out = append(out, c.pem)
	}
	return out
}

// verifyingClient delivers like a BMC with VerifyCertificate set: the
// destination's chain and host name are verified against cas only. A new
// connection per request, so nothing is kept between deliveries.
func verifyingClient(cas []string) *http.Client {
	pool := x509.NewCertPool()
	for _, c := range cas {
		pool.AppendCertsFromPEM([]byte(c))
	}
	return &http.Client{Transport: &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout: 5 * time.Second,
		DisableKeepAlives:   true,
	}}
}

// serveSubCerts serves <subscription>/Certificates and its members: GET the
// collection or a member, POST a certificate (PEM, one certificate), DELETE
// a member.
func (r *Redfish) serveSubCerts(w http.ResponseWriter, req *http.Request, path string) {
	i := strings.Index(path, certsSuffix)
	subPath, rest := path[:i], path[i+len(certsSuffix):]
	coll := subPath + certsSuffix
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.findSub(subPath)
	if s == nil || s.foreign || (rest != "" && !strings.HasPrefix(rest, "/")) {
		rfError(w, http.StatusNotFound, "ResourceMissingAtURI", path+" does not exist")
		return
	}
	certDoc := func(c subCert) map[string]any {
		return map[string]any{"@odata.id": coll + "/" + c.id, "@odata.type": "#Certificate.v1_8_0.Certificate",
			"Id": c.id, "Name": "Certificate " + c.id, "CertificateString": c.pem, "CertificateType": "PEM"}
	}
	id := strings.TrimPrefix(rest, "/")
	switch {
	case req.Method == http.MethodGet && id == "":
		members := []any{}
		for _, c := range s.certs {
			members = append(members, map[string]any{"@odata.id": coll + "/" + c.id})
		}
		writeJSON(w, http.StatusOK, map[string]any{"@odata.id": coll, "@odata.type": "#CertificateCollection.CertificateCollection",
			"Name": "Certificates", "Members": members, "Members@odata.count": len(members)})
	case req.Method == http.MethodPost && id == "":
		var body struct{ CertificateString, CertificateType string }
		if err := json.NewDecoder(io.LimitReader(req.Body, 1<<16)).Decode(&body); err != nil {
			rfError(w, http.StatusBadRequest, "MalformedJSON", "bad certificate")
			return
		}
		if body.CertificateType != "PEM" {
			eventError(w, http.StatusBadRequest, "PropertyValueNotInList", "The value '"+body.CertificateType+"' for the property CertificateType is not in the list of acceptable values.", "CertificateType", body.CertificateType, "CertificateType")
			return
		}
		blk, more := pem.Decode([]byte(body.CertificateString))
		if blk == nil || blk.Type != "CERTIFICATE" || strings.TrimSpace(string(more)) != "" {
			eventError(w, http.StatusBadRequest, "PropertyValueFormatError", "The value for the property CertificateString is not a format that the property can accept.", "CertificateString", "CertificateString")
			return
		}
		if _, err := x509.ParseCertificate(blk.Bytes); err != nil {
			eventError(w, http.StatusBadRequest, "PropertyValueFormatError", "The value for the property CertificateString is not a format that the property can accept.", "CertificateString", "CertificateString")
			return
		}
		s.nextCert++
		c := subCert{id: strconv.Itoa(s.nextCert), pem: string(pem.EncodeToMemory(blk))}
		s.certs = append(s.certs, c)
		w.Header().Set("Location", coll+"/"+c.id)
		writeJSON(w, http.StatusCreated, certDoc(c))
	case req.Method == http.MethodGet:
		for _, c := range s.certs {
			if c.id == id {
				writeJSON(w, http.StatusOK, certDoc(c))
				return
			}
		}
		rfError(w, http.StatusNotFound, "ResourceMissingAtURI", path+" does not exist")
	case req.Method == http.MethodDelete && id != "":
		for i, c := range s.certs {
			if c.id == id {
				s.certs = append(s.certs[:i:i], s.certs[i+1:]...)
				w.WriteHeader(http.StatusNoContent)
				return
			}
		}
		rfError(w, http.StatusNotFound, "ResourceMissingAtURI", path+" does not exist")
	default:
		rfError(w, http.StatusMethodNotAllowed, "OperationNotAllowed", req.Method+" is not allowed on "+path)
	}
}
