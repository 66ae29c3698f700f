// editor.js - a code editor for a cell: CodeMirror 5 (Debian's libjs-codemirror, loaded by
// index.html as classic scripts), with the language's highlighting, bracket matching,
// Shift+Enter to run and Ctrl+Up/Down (Cmd on a Mac) through the code run before.
const MODES = {python: 'python', bash: 'shell', javascript: 'javascript'};

export function createEditor(parent, {value, language, onRun, history}) {
  const cm = window.CodeMirror(parent, {
    value: value || '', mode: MODES[language] || 'python', lineNumbers: false,
    matchBrackets: true, indentUnit: language === 'python' ? 4 : 2, viewportMargin: Infinity,
    extraKeys: {
      'Shift-Enter': () => onRun(),
      'Ctrl-Enter': () => onRun(),
      'Ctrl-Up': () => recall(-1), 'Cmd-Up': () => recall(-1),
      'Ctrl-Down': () => recall(1), 'Cmd-Down': () => recall(1),
      Tab: (c) => c.somethingSelected() ? c.indentSelection('add')
                                        : c.replaceSelection(' '.repeat(c.getOption('indentUnit'))),
    },
  });
  let pos = null; // where in history we are; null: at the draft
  let draft = '';
  function recall(step) {
    const list = history();
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
    setLanguage: (l) => cm.setOption('mode', MODES[l] || 'python'),
    focus: () => { cm.focus(); cm.setCursor(cm.lineCount(), 0); },
  };
}
