// editor.js - a cell's editor: CodeMirror 5 (Debian's libjs-codemirror, loaded by index.html
// as classic scripts) with the language's highlighting and bracket matching. Keys as in
// Jupyter's edit mode: Shift+Enter runs and moves on, Ctrl+Enter runs in place, Alt+Enter
// runs and inserts a cell below, Esc leaves the editor for command mode (notebook.js), Tab
// indents; Ctrl+Up/Down (Cmd on a Mac) walk through the code run before. The editor is out of
// the Tab order (tabindex -1): it is entered with Enter on its cell or a click, and left
// with Esc, so that Tab never traps a keyboard user in it (WCAG 2.1.2).
const MODES = {python: 'python', bash: 'shell', javascript: 'javascript', markdown: 'markdown'};

export function createEditor(parent, {value, language, label, describedBy, keys, history}) {
  const cm = window.CodeMirror(parent, {
    value: value || '', mode: MODES[language] || 'python', lineNumbers: false,
    matchBrackets: true, indentUnit: language === 'python' ? 4 : 2, viewportMargin: Infinity,
    lineWrapping: language === 'markdown', tabindex: -1, screenReaderLabel: label,
    extraKeys: {
      'Shift-Enter': () => keys.run('next'),
      'Ctrl-Enter': () => keys.run('stay'), 'Cmd-Enter': () => keys.run('stay'),
      'Alt-Enter': () => keys.run('insert'),
      Esc: () => keys.escape(),
      'Ctrl-Up': () => recall(-1), 'Cmd-Up': () => recall(-1),
      'Ctrl-Down': () => recall(1), 'Cmd-Down': () => recall(1),
      Tab: (c) => c.somethingSelected() ? c.indentSelection('add')
                                        : c.replaceSelection(' '.repeat(c.getOption('indentUnit'))),
      'Shift-Tab': (c) => c.indentSelection('subtract'),
    },
  });
  const input = cm.getInputField();
  if (describedBy) input.setAttribute('aria-describedby', describedBy);
  input.setAttribute('aria-multiline', 'true');
  let pos = null; // where in history we are; null: at the draft
  let draft = '';
  function recall(step) {
    const list = history ? history() : [];
    if (!list.length) return;
    if (pos === null) { draft = cm.getValue(); pos = list.length; }
    pos = Math.min(Math.max(pos + step, 0), list.length);
    cm.setValue(pos === list.length ? draft : list[pos]);
    cm.setCursor(cm.lineCount(), 0);
  }
  cm.on('change', (c, ch) => { if (ch.origin !== 'setValue') pos = null; });
  return {
    cm,
    getValue: () => cm.getValue(),
    setValue: (v) => cm.setValue(v),
    setLanguage: (l) => {
      cm.setOption('mode', MODES[l] || 'python');
      cm.setOption('lineWrapping', l === 'markdown');
      cm.setOption('indentUnit', l === 'python' ? 4 : 2);
    },
    setLabel: (l) => cm.setOption('screenReaderLabel', l),
    focus: (atEnd) => { cm.focus(); if (atEnd !== false) cm.setCursor(cm.lineCount(), 0); },
    hasFocus: () => cm.hasFocus(),
    refresh: () => cm.refresh(),
    onChange: (fn) => cm.on('changes', fn),
  };
}
