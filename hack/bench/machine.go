package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
)

// unknown stands for a fact that could not be read.
const unknown = "unknown"

// Machine holds the facts a reader needs to judge the numbers.
type Machine struct {
	CPU          string  `json:"cpu"`
	Cores        int     `json:"cores"`
	Go           string  `json:"go"`
	Redis        string  `json:"redis"`
	Kernel       string  `json:"kernel"`
	LoadAtStart  string  `json:"loadAverageAtStart"`
	LoadAtEnd    string  `json:"loadAverageAtEnd"`
	WallSeconds  float64 `json:"wallSeconds"`
	StartedAtUTC string  `json:"startedAtUTC"`
}

// machineFacts reads the CPU model, core count, Go and redis-server versions and the kernel.
func machineFacts() Machine {
	m := Machine{CPU: unknown, Cores: runtime.NumCPU(), Go: runtime.Version(), Redis: unknown, Kernel: unknown}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		s := bufio.NewScanner(f)
		for s.Scan() {
			if k, v, ok := strings.Cut(s.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
		_ = f.Close()
	}
	if out, err := exec.Command("redis-server", "--version").Output(); err == nil {
		for f := range strings.FieldsSeq(string(out)) {
			if v, ok := strings.CutPrefix(f, "v="); ok {
				m.Redis = v
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	return m
}

// rssMiB is the resident set size (VmRSS) of a process in MiB, or -1 if it cannot be read.
func rssMiB(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 64)
			if err != nil {
				return -1
			}
			return v / 1024
		}
	}
	return -1
}
