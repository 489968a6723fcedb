package hilproxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/obmesh/obmesh/coordinator/api"
)

// ErrBadOBM means a registration body obmd would refuse with 500: not JSON,
// an unknown type, a missing or null info, or info fields of the wrong type.
var ErrBadOBM = errors.New("invalid obm description")

// obmBody is obmd's PUT /node/{id} body, plus obmesh's optional "site".
// Field matching is encoding/json's (case-insensitive, unknown keys
// ignored), as obmd's was.
type obmBody struct {
	Type string          `json:"type"`
	Info json.RawMessage `json:"info"`
	Site string          `json:"site"`
}

// SpecFromOBM turns obmd's node description ({"type": ..., "info": {...}})
// into a node spec. It is what PUT /node/{id} and the obmd importer use.
func SpecFromOBM(label string, body []byte) (api.NodeSpec, error) {
	var b obmBody
	if err := json.Unmarshal(body, &b); err != nil {
		return api.NodeSpec{}, fmt.Errorf("%w: %v", ErrBadOBM, err)
	}
	if len(b.Info) == 0 || bytes.Equal(bytes.TrimSpace(b.Info), []byte("null")) {
		return api.NodeSpec{}, fmt.Errorf("%w: info is missing", ErrBadOBM)
	}
	spec := api.NodeSpec{Name: label, Driver: b.Type, Site: b.Site}
	decode := func(v any) error {
		if err := json.Unmarshal(b.Info, v); err != nil {
			return fmt.Errorf("%w: %s info: %v", ErrBadOBM, b.Type, err)
		}
		return nil
	}
	switch b.Type {
	case "mock":
		var i struct {
			Addr      string `json:"addr"`
			NumWrites int64  `json:"NumWrites"`
		}
		if err := decode(&i); err != nil {
			return api.NodeSpec{}, err
		}
		if i.NumWrites < 0 {
			return api.NodeSpec{}, fmt.Errorf("%w: NumWrites must not be negative", ErrBadOBM)
		}
		spec.Address = i.Addr
		if i.NumWrites != 0 {
			spec.Options = map[string]string{"NumWrites": strconv.FormatInt(i.NumWrites, 10)}
		}
	case "dummy":
		var i struct {
			Addr string `json:"addr"`
		}
		if err := decode(&i); err != nil {
			return api.NodeSpec{}, err
		}
		spec.Address = i.Addr
	case "ipmi":
		var i struct {
			Addr        string `json:"addr"`
			User        string `json:"user"`
			Pass        string `json:"pass"`
			Port        *int   `json:"port"`
			CipherSuite *int   `json:"cipher_suite"`
			Privilege   string `json:"privilege"`
		}
		if err := decode(&i); err != nil {
			return api.NodeSpec{}, err
		}
		spec.Address, spec.Username, spec.Password = i.Addr, i.User, i.Pass
		opts := map[string]string{}
		if i.Port != nil {
			opts["port"] = strconv.Itoa(*i.Port)
		}
		if i.CipherSuite != nil {
			opts["cipher_suite"] = strconv.Itoa(*i.CipherSuite)
		}
		if i.Privilege != "" {
			opts["privilege"] = i.Privilege
		}
		if len(opts) > 0 {
			spec.Options = opts
		}
	case "redfish":
		var i struct {
			Addr        string   `json:"addr"`
			User        string   `json:"user"`
			Pass        string   `json:"pass"`
			System      string   `json:"system"`
			Insecure    bool     `json:"insecure"`
			CACert      string   `json:"ca_cert"`
			Fingerprint string   `json:"fingerprint"`
			BasicAuth   bool     `json:"basic_auth"`
			RequestRate *float64 `json:"request_rate"`
		}
		if err := decode(&i); err != nil {
			return api.NodeSpec{}, err
		}
		spec.Address, spec.Username, spec.Password = i.Addr, i.User, i.Pass
		opts := map[string]string{}
		if i.System != "" {
			opts["system"] = i.System
		}
		if i.Insecure {
			opts["insecure"] = "true"
		}
		if i.CACert != "" {
			opts["ca_cert"] = i.CACert
		}
		if i.Fingerprint != "" {
			opts["fingerprint"] = i.Fingerprint
		}
		if i.BasicAuth {
			opts["basic_auth"] = "true"
		}
		if i.RequestRate != nil {
			opts["request_rate"] = strconv.FormatFloat(*i.RequestRate, 'g', -1, 64)
		}
		if len(opts) > 0 {
			spec.Options = opts
		}
	default:
		return api.NodeSpec{}, fmt.Errorf("%w: unknown obm type %q", ErrBadOBM, b.Type)
	}
	return spec, nil
}
