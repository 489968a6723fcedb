package archtest

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

var metricLiteral = regexp.MustCompile(`"(obmesh_[a-z0-9_]+)"`)

// codeMetrics lists the metric names registered in obmesh's code: the
// "obmesh_..." string literals of its non-test Go files.
func codeMetrics(t *testing.T) []string {
	t.Helper()
	seen := map[string]bool{}
	err := filepath.WalkDir(root(t), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range metricLiteral.FindAllStringSubmatch(string(b), -1) {
			seen[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for m := range seen {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}

// TestMetrics_DocumentedAndOnTheDashboard: every metric the code registers
// has a row in docs/operations.md ("Monitoring") and a panel query in
// docs/grafana-dashboard.json; every metric those name exists in the code
// (histograms' _bucket, _sum and _count series included); the dashboard is
// valid JSON whose panels have distinct ids, use the data source variable
// and have balanced queries.
func TestMetrics_DocumentedAndOnTheDashboard(t *testing.T) {
	code := codeMetrics(t)
	if len(code) < 30 {
		t.Fatalf("found only %d metric names in the code: %v", len(code), code)
	}
	known := func(name string) bool {
		if slices.Contains(code, name) {
			return true
		}
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suf); ok && slices.Contains(code, base) && strings.HasSuffix(base, "_seconds") {
				return true
			}
		}
		return false
	}

	ops := readFile(t, filepath.Join(root(t), "docs", "operations.md"))
	rows := regexp.MustCompile("(?m)^\\| `(obmesh_[a-z0-9_]+)` \\|").FindAllStringSubmatch(ops, -1)
	var documented []string
	for _, r := range rows {
		documented = append(documented, r[1])
		if !known(r[1]) {
			t.Errorf("docs/operations.md documents %s, which the code does not register", r[1])
		}
	}
	for _, m := range code {
		if !slices.Contains(documented, m) {
			t.Errorf("%s is registered in the code but has no row in docs/operations.md (Monitoring)", m)
		}
	}

	var dash struct {
		Title  string `json:"title"`
		Panels []struct {
			ID         int    `json:"id"`
			Type       string `json:"type"`
			Title      string `json:"title"`
			Datasource struct {
				UID string `json:"uid"`
			} `json:"datasource"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name string `json:"name"`
			} `json:"list"`
		} `json:"templating"`
	}
	raw := readFile(t, filepath.Join(root(t), "docs", "grafana-dashboard.json"))
	if err := json.Unmarshal([]byte(raw), &dash); err != nil {
		t.Fatalf("docs/grafana-dashboard.json: %v", err)
	}
	vars := map[string]bool{}
	for _, v := range dash.Templating.List {
		vars[v.Name] = true
	}
	ids := map[int]bool{}
	used := map[string]bool{}
	for _, p := range dash.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		if p.Datasource.UID != "${datasource}" || len(p.Targets) == 0 {
			t.Errorf("panel %q: data source %q, %d queries", p.Title, p.Datasource.UID, len(p.Targets))
		}
		for _, tg := range p.Targets {
			if strings.Count(tg.Expr, "(") != strings.Count(tg.Expr, ")") || strings.Count(tg.Expr, "{") != strings.Count(tg.Expr, "}") ||
				strings.Count(tg.Expr, "[") != strings.Count(tg.Expr, "]") {
				t.Errorf("panel %q: unbalanced query %s", p.Title, tg.Expr)
			}
			for _, v := range regexp.MustCompile(`\$([a-z_]+)`).FindAllStringSubmatch(tg.Expr, -1) {
				if !vars[v[1]] {
					t.Errorf("panel %q: query uses $%s, which the dashboard does not define", p.Title, v[1])
				}
			}
			for _, m := range regexp.MustCompile(`obmesh_[a-z0-9_]+`).FindAllString(tg.Expr, -1) {
				if !known(m) {
					t.Errorf("panel %q: %s is not a metric of the code", p.Title, m)
				}
				used[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m, "_bucket"), "_count"), "_sum")] = true
			}
		}
	}
	for _, m := range code {
		if !used[m] {
			t.Errorf("%s is on no panel of docs/grafana-dashboard.json", m)
		}
	}
}
