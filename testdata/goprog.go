// goprog is the Go program of ptfs's site tests: Go's symbol names have
// dots, parentheses and stars (main.add, main.(*acc).push).
package main

import (
	"fmt"
	"os"
	"strconv"
)

type acc struct{ sum int }

//go:noinline
func add(a, b int) int { return a + b }

//go:noinline
func (c *acc) push(v int) { c.sum += v }

func main() {
	n := 1
	if len(os.Args) > 1 {
		n, _ = strconv.Atoi(os.Args[1])
	}
	c := &acc{}
	for i := 0; i < n; i++ {
		c.push(add(i, i+1))
	}
	fmt.Println(c.sum)
}
