// The loss settings: one control per LossConfig field of /api/v1/options, grouped; the preset.

import { $, clear, el } from "./dom.js";
import { CORRECTION_SETTINGS, GROUP_TITLES, RUN_RANKS, SUMMARY } from "./labels.js";
import { state } from "./state.js";

const PRESET_NONE = RUN_RANKS.ownConfig; // the preset menu's entry for a run's own config

// `onChange(delay)` recomputes after `delay` ms (number fields wait for typing to pause).
export function buildControls(onChange) {
  const { options } = state.ui;
  const container = clear($("#control-groups"));
  const groups = new Map();
  for (const field of options.fields) {
    if (field.group === "preset") continue;
    if (!groups.has(field.group)) groups.set(field.group, []);
    groups.get(field.group).push(field);
  }
  for (const [group, fields] of groups) {
    const fieldset = el("fieldset", { class: "control-group" }, el("legend", { text: GROUP_TITLES[group] || group }));
    for (const field of fields) fieldset.append(buildControl(field, onChange));
    container.append(fieldset);
  }
  const preset = clear($("#preset"));
  for (const p of options.presets) preset.append(el("option", { value: p.name, text: p.name, title: p.doc }));
  preset.addEventListener("change", (e) => {
    state.config = { preset: e.target.value };
    onChange(0);
  });
}

function buildControl(field, onChange) {
  const id = `cfg-${field.name}`;
  const desc = el("span", { id: `${id}-doc`, class: "visually-hidden", text: field.doc });
  const label = el("label", { for: id, title: field.doc, text: field.name });
  const touched = el("div", { class: "touched", hidden: true });
  let input;
  let widget;
  const changed = (value) => {
    state.config[field.name] = value;
    onChange(field.type === "number" || field.type === "integer" ? 180 : 0);
  };
  if (field.type === "choice") {
    input = el(
      "select",
      { id, "aria-describedby": desc.id, onchange: () => changed(input.value) },
      ...field.choices.map((c) => el("option", { value: c, text: c })),
    );
    widget = input;
  } else if (field.type === "boolean") {
    input = el("input", { id, type: "checkbox", "aria-describedby": desc.id, onchange: () => changed(input.checked) });
    widget = input;
  } else if (field.type === "string") {
    // free text (verl's rollout_rs: comma-chained criteria, its thresholds): empty is none; a bad spec
    // gets the server's 4xx, which names the field
    input = el("input", { id, type: "text", spellcheck: "false", placeholder: "none", "aria-describedby": desc.id });
    input.addEventListener("change", () => changed(input.value.trim() === "" ? null : input.value.trim()));
    widget = input;
  } else {
    input = el("input", { id, type: "number", step: "any", "aria-describedby": desc.id });
    const read = () => (input.value === "" ? null : Number(input.value));
    // an optional setting that is off is switched on by a value typed into its box, as by its tick
    const on = field.nullable
      ? el("input", { type: "checkbox", "aria-label": `${field.name} on`, title: "on / off" })
      : null;
    input.addEventListener("input", () => {
      if (input.value === "" || !Number.isFinite(Number(input.value))) return;
      if (on) on.checked = true;
      changed(read());
    });
    widget = input;
    if (on) {
      on.addEventListener("change", () => {
        // Turned on: the value a preset gives it (verl's dual clip: the verl presets' c), one fact with them.
        const preset = state.ui.options.presets
          .map((p) => p.config[field.name])
          .find((v) => v !== null && v !== undefined);
        if (on.checked && input.value === "")
          input.value = String(preset ?? (field.gt !== undefined ? Math.max(field.gt * 2, 1) : 1));
        changed(on.checked ? read() : null);
      });
      widget = el("span", { class: "nullable" }, on, input);
      state.ui.controls.set(`${field.name}:on`, on);
    }
  }
  state.ui.controls.set(field.name, input);
  state.ui.controls.set(`${field.name}:touched`, touched);
  state.ui.controls.set(`${field.name}:label`, label);
  // a control names the verl and TRL settings it stands for, visibly (the tooltip alone hid them): a
  // correction's from the labels, a variant's own setting from its declaration (field.verl, field.trl)
  const mapsTo = CORRECTION_SETTINGS[field.name] || declaredNames(field);
  const maps = mapsTo ? el("div", { class: "maps-to muted", id: `${id}-maps`, text: mapsTo }) : null;
  return el("div", { class: "control" }, label, widget, desc, touched, ...(maps ? [maps] : []));
}

function declaredNames(field) {
  const names = [field.verl && `verl: ${field.verl}`, field.trl && `TRL: ${field.trl}`];
  return names.filter(Boolean).join(" · ");
}

// Show the resolved config of a response: values, which differ from the preset, clamp counts.
export function renderControls(data) {
  const { options } = state.ui;
  const config = data.config;
  // a config of no preset (a run's own: an import's, a verl capture's) is named so, never as a preset it is not
  const name = config.preset ?? state.config.preset ?? null;
  const preset = name === null ? config : options.presets.find((p) => p.name === name)?.config || {};
  const select = $("#preset");
  let own = select.querySelector("option[value='']");
  if (name === null && !own) {
    own = el("option", { value: "", text: PRESET_NONE, disabled: true });
    select.prepend(own);
  }
  if (own) own.hidden = name !== null;
  select.value = name ?? "";
  for (const field of options.fields) {
    const input = state.ui.controls.get(field.name);
    if (!input) continue;
    const value = config[field.name];
    const active = document.activeElement === input;
    if (field.type === "boolean") input.checked = Boolean(value);
    else if (!active) input.value = value === null || value === undefined ? "" : String(value);
    const on = state.ui.controls.get(`${field.name}:on`);
    if (on) {
      on.checked = value !== null;
      input.placeholder = value === null ? SUMMARY.settingOff : ""; // off: empty, said so; typing turns it on
    }
    const edited = JSON.stringify(value) !== JSON.stringify(preset[field.name]);
    state.ui.controls.get(`${field.name}:label`).classList.toggle("edited", edited);
    const touched = state.ui.controls.get(`${field.name}:touched`);
    const n = data.clamp_counts[field.name];
    touched.hidden = !n;
    touched.textContent = n ? SUMMARY.touched(n) : "";
  }
}
