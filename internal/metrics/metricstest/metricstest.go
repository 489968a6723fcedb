// Package metricstest reads a /metrics answer with Prometheus' own text
// parser (github.com/prometheus/common/expfmt) for tests: parse, then look
// up a sample by name and labels. Only tests import it.
package metricstest

import (
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Families are parsed metric families by name.
type Families map[string]*dto.MetricFamily

// Parse reads the text exposition format; any syntax error fails.
func Parse(r io.Reader) (Families, error) {
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(r)
	return Families(fams), err
}

// Scrape GETs url (plain text format) with a 10 s deadline and parses it.
func Scrape(url string) (Families, error) {
	c := &http.Client{Timeout: 10 * time.Second}
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/plain; version=0.0.4")
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return nil, fmt.Errorf("GET %s: %s %s", url, resp.Status, b)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		return nil, fmt.Errorf("GET %s: content type %q, want text/plain", url, ct)
	}
	return Parse(io.LimitReader(resp.Body, 16<<20))
}

// match reports whether m carries every label of want (others may be
// there too).
func match(m *dto.Metric, want map[string]string) bool {
	n := 0
	for _, lp := range m.GetLabel() {
		if v, ok := want[lp.GetName()]; ok {
			if v != lp.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(want)
}

// Value is the sum of the counter, gauge or untyped samples of name whose
// labels include want; ok is false when there is none.
func (f Families) Value(name string, want map[string]string) (v float64, ok bool) {
	fam := f[name]
	if fam == nil {
		return 0, false
	}
	for _, m := range fam.GetMetric() {
		if !match(m, want) {
			continue
		}
		switch {
		case m.Counter != nil:
			v += m.GetCounter().GetValue()
		case m.Gauge != nil:
			v += m.GetGauge().GetValue()
		case m.Untyped != nil:
			v += m.GetUntyped().GetValue()
		default:
			continue
		}
		ok = true
	}
	return v, ok
}

// Histogram is the summed sample count and sum of the histogram name's
// series whose labels include want.
func (f Families) Histogram(name string, want map[string]string) (count uint64, sum float64, ok bool) {
	fam := f[name]
	if fam == nil {
		return 0, 0, false
	}
	for _, m := range fam.GetMetric() {
		if m.Histogram == nil || !match(m, want) {
			continue
		}
		count += m.GetHistogram().GetSampleCount()
		sum += m.GetHistogram().GetSampleSum()
		ok = true
	}
	return count, sum, ok
}

// Type is the family's type (COUNTER, GAUGE, HISTOGRAM, ...), "" if absent.
func (f Families) Type(name string) string {
	if fam := f[name]; fam != nil {
		return fam.GetType().String()
	}
	return ""
}

// LabelValues lists the distinct values label takes in family name.
func (f Families) LabelValues(name, label string) []string {
	seen := map[string]bool{}
	if fam := f[name]; fam != nil {
		for _, m := range fam.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label {
					seen[lp.GetValue()] = true
				}
			}
		}
	}
	out := make([]string, 0, len(seen))
	for v := range seen {
		out = append(out, v)
	}
	sort.Strings(out)
	return out
}

// Names lists the families' names, sorted.
func (f Families) Names() []string {
	out := make([]string, 0, len(f))
	for n := range f {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
