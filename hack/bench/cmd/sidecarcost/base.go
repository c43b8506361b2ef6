package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// resolve names rev's commit by its short hash, so that the report says what was measured
// whatever name -base gave (HEAD, a branch).
func resolve(ctx context.Context, root, rev string) (string, error) {
	out, err := exec.CommandContext(ctx, "git", "-C", root, "rev-parse", "--short", "--verify", rev+"^{commit}").Output()
	if err != nil {
		return "", fmt.Errorf("-base %s is not a commit of %s: %w", rev, root, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// extract writes the tree of commit into dir with git archive.
func extract(ctx context.Context, root, commit, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	tarball := dir + ".tar"
	if out, err := exec.CommandContext(ctx, "git", "-C", root, "archive", "--format=tar", "-o", tarball, commit).CombinedOutput(); err != nil {
		return fmt.Errorf("git archive %s: %w\n%s", commit, err, out)
	}
	defer func() { _ = os.Remove(tarball) }()
	if out, err := exec.CommandContext(ctx, "tar", "-xf", tarball, "-C", dir).CombinedOutput(); err != nil {
		return fmt.Errorf("extracting %s: %w\n%s", tarball, err, out)
	}
	return nil
}

// printer is the program run inside a tree to print what its manager loads for sidecars. It is
// added to the tree through go's -overlay, so the working tree is not written to.
const printer = `package main

import (
	"encoding/json"
	"os"

	"github.com/redline-dev/redline/internal/redisacl"
)

func main() {
	type script struct{ Name, Source string }
	var out []script
	for _, s := range redisacl.SidecarScripts() {
		out = append(out, script{s.Name, s.Source})
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		os.Exit(1)
	}
}
`

// printScripts runs printer inside tree and returns the scripts it printed.
func printScripts(ctx context.Context, tree, dir string) ([]script, error) {
	src, err := os.CreateTemp(dir, "printer-*.go")
	if err != nil {
		return nil, fmt.Errorf("writing the printer: %w", err)
	}
	_, err = io.WriteString(src, printer)
	if cerr := src.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("writing the printer: %w", err)
	}
	pkg := filepath.Join(tree, "internal", "zz_sidecarcost_printer")
	ov, err := json.Marshal(map[string]map[string]string{"Replace": {filepath.Join(pkg, "main.go"): src.Name()}})
	if err != nil {
		return nil, fmt.Errorf("encoding the overlay: %w", err)
	}
	ovFile := src.Name() + ".overlay.json"
	if err := os.WriteFile(ovFile, ov, 0o644); err != nil {
		return nil, fmt.Errorf("writing the overlay: %w", err)
	}
	cmd := exec.CommandContext(ctx, "go", "run", "-overlay", ovFile, "./internal/zz_sidecarcost_printer")
	cmd.Dir = tree
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go run the printer in %s: %w\n%s", tree, err, stderr.String())
	}
	var scripts []script
	if err := json.Unmarshal(out, &scripts); err != nil {
		return nil, fmt.Errorf("decoding the printer's output: %w", err)
	}
	if len(scripts) == 0 {
		return nil, errors.New("the printer printed no scripts")
	}
	return scripts, nil
}
