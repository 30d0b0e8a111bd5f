/* types: arguments of every fetch type of classic uprobes. For i in
 * 0..N-1 (argv[1], default 5) types1, types2 and types3 get a struct whose
 * fields depend on i and the string strs[i % 6]; the last is the address 1,
 * whose read faults. */
#include <stdlib.h>
#include <string.h>

struct s {
	long a;			/* +0 */
	unsigned char b;	/* +8 */
	signed char c;		/* +9 */
	short d;		/* +10 */
	unsigned short e;	/* +12 */
	int f;			/* +16 */
	unsigned int g;		/* +20 */
	unsigned long bits;	/* +24 */
	char name[16];		/* +32 */
};

__attribute__((noinline, noipa)) long types1(struct s *p, const char *str) { return p->a + (long)str; }
__attribute__((noinline, noipa)) long types2(struct s *p, const char *str) { return p->a - (long)str; }
__attribute__((noinline, noipa)) long types3(struct s *p, const char *str) { return p->a ^ (long)str; }

int main(int argc, char **argv)
{
	static const char *strs[] = { "plain", "", "tab\there \"q\" back\\slash", "esc\x1b[31m \xc3\xa9 nl\nend",
				      "a, b=c] d", (const char *)1 };
	int n = argc > 1 ? atoi(argv[1]) : 5;
	long acc = 0;

	for (int i = 0; i < n; i++) {
		struct s v = { .a = -1 - i, .b = 250 + i, .c = 'A' + i, .d = -300 - i, .e = 65000 + i,
			       .f = -70000 - i, .g = 4000000000u + i, .bits = 0xdeadbeefcafe1234ul + 16 * i };
		strcpy(v.name, i % 2 ? "odd" : "even \"n\"");
		const char *str = strs[i % 6];
		acc += types1(&v, str) + types2(&v, str) + types3(&v, str);
	}
	return (int)(acc & 1) * 0;
}
