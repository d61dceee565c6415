#!/usr/bin/env python3
"""cu2cc.py: turn a CUDA C source into host C++ for the emulation tier.

    cu2cc.py IN OUT

Only what C++ cannot parse is rewritten, each on its own line so that line
numbers stay those of the source (a #line directive names it):
  kernel<<<grid, block[, smem[, stream]]>>>(args)
      -> emu::launcher(kernel, "kernel", grid, block[, smem[, stream]])(args)
  __shared__ T name[dims];            -> T (&name)[dims] = emu::shared<T[dims]>(ID);
  extern __shared__ [__align__(n)] T name[];
                                      -> T *name = (T *)emu::dyn_shared();
Everything else (qualifiers, intrinsics, WMMA, the runtime API) is the
emulation headers' business. Anything this script does not understand is an
error naming the line, never a silent pass-through."""
import re
import sys

DYN = re.compile(r'extern\s+__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s*)?([A-Za-z_][\w\s\*:<>]*?)\s*\b(\w+)\s*\[\s*\]\s*;')
STATIC = re.compile(r'__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s*)?([A-Za-z_][\w\s:<>]*?)\s+(\w+)\s*((?:\[[^\]]+\])*)\s*;')


def fail(path, text, pos, msg):
    line = text.count('\n', 0, pos) + 1
    sys.exit(f'{path}:{line}: cu2cc: {msg}')


def kernel_start(text, end):
    """Index where the kernel expression that ends before `end` starts."""
    i = end
    while i > 0 and text[i - 1] in ' \t':
        i -= 1
    if i > 0 and text[i - 1] == '>':  # template arguments
        depth = 0
        while i > 0:
            i -= 1
            if text[i] == '>':
                depth += 1
            elif text[i] == '<':
                depth -= 1
                if depth == 0:
                    break
        if depth != 0:
            return -1
    while i > 0 and (text[i - 1].isalnum() or text[i - 1] in '_:'):
        i -= 1
    return i


def launches(path, text):
    out, pos = [], 0
    while True:
        a = text.find('<<<', pos)
        if a < 0:
            out.append(text[pos:])
            return ''.join(out)
        b = text.find('>>>', a)
        if b < 0:
            fail(path, text, a, '<<< without >>>')
        k = kernel_start(text, a)
        name = text[k:a].strip() if k >= 0 else ''
        if not re.fullmatch(r'[A-Za-z_][\w:]*(\s*<[^;{}]*>)?', name):
            fail(path, text, a, f'cannot tell the kernel of this launch ({name!r})')
        out.append(text[pos:k])
        label = re.sub(r'\s+', ' ', name).replace('"', '')
        out.append(f'emu::launcher({name}, "{label}", {text[a + 3:b]})')
        pos = b + 3


def shared(path, text):
    text = DYN.sub(lambda m: f'{m.group(1).strip()} *{m.group(2)} = ({m.group(1).strip()} *)emu::dyn_shared();', text)

    def static(m):
        t, n, dims = m.group(1).strip(), m.group(2), m.group(3)
        if t.startswith('extern'):
            fail(path, text, m.start(), 'extern __shared__ of a form cu2cc does not know')
        ref = f'(&{n}){dims}' if dims else f'&{n}'
        return f'{t} {ref} = emu::shared<{t}{dims}>(__COUNTER__);'
    text = STATIC.sub(static, text)
    left = text.find('__shared__')
    if left >= 0:
        fail(path, text, left, '__shared__ declaration of a form cu2cc does not know')
    return text


def main():
    if len(sys.argv) != 3:
        sys.exit('usage: cu2cc.py IN OUT')
    src, dst = sys.argv[1], sys.argv[2]
    with open(src) as f:
        text = f.read()
    # comments could hold "<<<" or "__shared__": blank them out for the
    # search, keeping offsets, and apply the rewrites to code only
    code = re.sub(r'/\*.*?\*/|//[^\n]*', lambda m: re.sub(r'[^\n]', ' ', m.group(0)), text, flags=re.S)
    new = shared(src, launches(src, code))
    # comments were blanked: restore every line that the rewrite left alone
    old_lines, code_lines, new_lines = text.split('\n'), code.split('\n'), new.split('\n')
    if len(new_lines) != len(old_lines):
        sys.exit(f'{src}: cu2cc: the rewrite changed the number of lines')
    merged = [o if c == n else n for o, c, n in zip(old_lines, code_lines, new_lines)]
    with open(dst, 'w') as f:
        f.write(f'#line 1 "{src}"\n' + '\n'.join(merged))


if __name__ == '__main__':
    main()
