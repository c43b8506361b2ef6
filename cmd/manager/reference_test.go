package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/docgen"
)

// The built binary's -help lists exactly the flags of the reference's Manager section.
func TestHelpMatchesTheFlagsReference(t *testing.T) {
	g := NewWithT(t)
	bin := managerBinary(t)
	cmd := exec.Command(bin, "-help")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	g.Expect(cmd.Run()).To(Succeed(), "-help exits 0\n%s", out.String())
	md, err := os.ReadFile(filepath.Join("..", "..", docgen.Dir, "flags.md"))
	g.Expect(err).NotTo(HaveOccurred())
	var help []string
	for _, n := range docgen.HelpFlags(out.String()) {
		help = append(help, "--"+n)
	}
	g.Expect(help).To(HaveLen(len(docgen.TableNames(string(md), "Manager"))))
	g.Expect(help).To(ConsistOf(docgen.TableNames(string(md), "Manager")), "flags.md is out of date: run make docs")
}
