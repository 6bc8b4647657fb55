package main

import (
	"os/exec"
	"path/filepath"
	"testing"
)

// TestExamplesValidate: every configuration under examples/ and the
// repository's plugins.hcl pass `estuary validate`.
func TestExamplesValidate(t *testing.T) {
	files, err := filepath.Glob("../../../examples/*/plugins.hcl")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, "../../../plugins.hcl")
	if len(files) < 4 {
		t.Fatalf("found only %v", files)
	}
	for _, f := range files {
		t.Run(f, func(t *testing.T) {
			if out, err := exec.Command(estuaryBin, "validate", "-config", f).CombinedOutput(); err != nil {
				t.Errorf("estuary validate %s: %v\n%s", f, err, out)
			}
		})
	}
}
