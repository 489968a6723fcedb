// Package archtest holds repository-wide tests: the import rules of
// DESIGN.md section 6, package doc comments, and the example configs. It has
// no non-test code beyond this comment and the helpers below.
package archtest

import (
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"strings"
)

// Module is obmesh's module path.
const Module = "github.com/obmesh/obmesh"

// Package is the part of `go list -json` the rules read.
type Package struct {
	ImportPath string
	Dir        string
	Name       string
	Doc        string
	Imports    []string
	Deps       []string
	GoFiles    []string
	Standard   bool
}

// List runs `go list -json` on patterns from the module root dir.
func List(dir string, patterns ...string) ([]Package, error) {
	cmd := exec.Command("go", append([]string{"list", "-json"}, patterns...)...)
	cmd.Dir = dir
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	var pkgs []Package
	dec := json.NewDecoder(out)
	for {
		var p Package
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			cmd.Wait()
			return nil, err
		}
		pkgs = append(pkgs, p)
	}
	if err := cmd.Wait(); err != nil {
		return nil, fmt.Errorf("go list: %v: %s", err, stderr.String())
	}
	return pkgs, nil
}
